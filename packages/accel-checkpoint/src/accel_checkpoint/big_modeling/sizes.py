"""How big a model and its parts are, how much memory each device offers, and which weights are tied.

Sizes come from shapes and dtypes only, so the model may live on the meta device
(``init_empty_weights``). Names and results follow the reference's ``accelerate.utils.modeling``.
"""

from __future__ import annotations

import enum
import inspect
import logging
import os
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

Device = int | str | torch.device


class CustomDtype(enum.Enum):
    """Element types torch has no dtype for, as sizes for device maps: quantizers (diffusers' quanto, torchao,
    bitsandbytes) pass them to ``compute_module_sizes`` / ``infer_auto_device_map`` for weights they will load as
    fp8, 4-bit or 2-bit (``dtype_byte_size(CustomDtype.INT4) == 0.5``)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


_CUSTOM_DTYPE_BYTES = {CustomDtype.FP8: 1, CustomDtype.INT4: 1 / 2, CustomDtype.INT2: 1 / 4}


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string with a unit (``"5GB"`` = 5e9, ``"5GiB"`` = 5 * 2**30, ``"5Gb"`` = bits).

    Example::

        convert_file_size_to_int("1MiB")  # 1048576
    """
    units = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}
    error = ValueError(
        f"`size` {size} is not in a valid format. Use an integer for bytes, or a string with an unit (like '5.0GB')."
    )
    if isinstance(size, int):
        if size < 0:
            raise error
        return size
    for unit, factor in units.items():
        if size.upper().endswith(unit):
            try:
                value = int(float(size[: -len(unit)]) * factor)
            except ValueError:
                raise error from None
            # "Gb" / "Mb" / "Kb" (a lower-case b) are bits.
            return value // 8 if not unit.endswith("IB") and size.endswith("b") else value
    raise error


def dtype_byte_size(dtype: torch.dtype | CustomDtype) -> float:
    """Bytes per element of ``dtype`` (``torch.bool`` counts 1/8, as the reference does; ``CustomDtype.INT4`` 1/2)."""
    if isinstance(dtype, CustomDtype):
        return _CUSTOM_DTYPE_BYTES[dtype]
    if dtype == torch.bool:
        return 1 / 8
    if str(dtype).startswith("torch.float8"):
        return 1
    found = re.search(r"[^\d](\d+)$", str(dtype))
    if found is None:
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return int(found.group(1)) // 8


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``torch.float16`` from ``"float16"`` or ``"torch.float16"``."""
    return getattr(torch, dtype.replace("torch.", "")) if isinstance(dtype, str) else dtype


def _element_bytes(dtype: str | torch.dtype | CustomDtype) -> float:
    """Bytes per element of a dtype given as a name, a torch dtype or a ``CustomDtype``."""
    return dtype_byte_size(dtype if isinstance(dtype, CustomDtype) else _as_dtype(dtype))


def named_module_tensors(
    module: nn.Module, include_buffers: bool = True, recurse: bool = False, remove_non_persistent: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters, then (with ``include_buffers``) the buffers, of ``module`` with their names."""
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skipped: set[str] = set()
    if remove_non_persistent:
        skipped = set(module._non_persistent_buffers_set)
        if recurse:
            for _, sub in module.named_modules():
                skipped |= sub._non_persistent_buffers_set
    for name, buffer in module.named_buffers(recurse=recurse):
        if name not in skipped:
            yield name, buffer


def compute_module_sizes(
    model: nn.Module,
    dtype: str | torch.dtype | CustomDtype | None = None,
    special_dtypes: dict[str, str | torch.dtype | CustomDtype] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every submodule (and tensor) of ``model`` by qualified name; ``""`` is the whole model.

    dtype: count floating tensors as if loaded in this dtype (never larger than their own);
        integer and bool tensors keep their size. special_dtypes: per-tensor overrides.
    """
    target = None if dtype is None else _element_bytes(dtype)
    special = {k: _element_bytes(v) for k, v in (special_dtypes or {}).items()}
    sizes: defaultdict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        own = dtype_byte_size(tensor.dtype)
        if name in special:
            per_element = special[name]
        elif target is None or str(tensor.dtype).startswith(("torch.uint", "torch.int", "torch.bool")):
            per_element = own
        else:
            per_element = min(target, own)
        size = tensor.numel() * per_element
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            # A bool element counts 1/8 byte (as the reference's sizes): such a total is a float.
            sizes[".".join(parts[:depth])] += size  # pyright: ignore[reportArgumentType]
    return sizes


def get_max_layer_size(
    modules: list[tuple[str, Any]], module_sizes: dict[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """The size of the biggest layer among ``modules`` and the names of the layers of that size.

    A layer is a module without children, or one whose class is in ``no_split_module_classes``.
    """
    max_size, names = 0, []
    queue = list(modules)
    while queue:
        name, module = queue.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or module.__class__.__name__ in no_split_module_classes:
            size = module_sizes[name]
            if size > max_size:
                max_size, names = size, [name]
            elif size == max_size:
                names.append(name)
        else:
            queue = [(f"{name}.{n}", child) for n, child in children] + queue
    return max_size, names


def get_max_memory(max_memory: Mapping[Device, int | str] | None = None) -> dict[Device, int]:
    """Memory per device: what is free now when ``max_memory`` is None, else ``max_memory`` in bytes, GPUs first.

    Keys are GPU (or XPU) indices, ``"mps"``, ``"cpu"`` and ``"disk"``.
    """
    if max_memory is None:
        found: dict[Device, int] = {}
        backend = _accelerator_backend()
        if backend is not None:
            for index in range(backend.device_count()):
                found[index] = backend.mem_get_info(index)[0]
        found["mps" if torch.backends.mps.is_available() else "cpu"] = _available_ram()
        return found
    converted = {k: convert_file_size_to_int(v) if isinstance(v, str) else v for k, v in max_memory.items()}
    gpus = sorted(k for k in converted if isinstance(k, int))
    order = gpus + [k for k in ("mps", "cpu", "disk") if k in converted]
    unknown = [k for k in converted if k not in order]
    if unknown:
        raise ValueError(
            f"Device {unknown[0]} is not recognized, available devices are integers(for GPU/XPU), 'mps', 'cpu' and "
            "'disk'"
        )
    return {k: converted[k] for k in order}


def _accelerator_backend() -> Any:
    for kind in ("cuda", "xpu"):
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_available():
            return backend
    return None


def _available_ram() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # psutil is optional: the kernel's count of free pages
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[Device, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: str | torch.dtype | CustomDtype | None = None,
    special_dtypes: dict[str, str | torch.dtype | CustomDtype] | None = None,
    low_zero: bool = False,
) -> dict[Device, int]:
    """A ``max_memory`` that spreads the model evenly over the GPUs (``device_map="balanced"``).

    low_zero: put as little as possible on GPU 0 (which ``generate`` uses for other work).
    With no GPU, ``max_memory`` comes back unchanged.
    """
    user_set = max_memory is not None
    memory = get_max_memory(max_memory)
    gpus = sorted(k for k, v in memory.items() if isinstance(k, int) and v > 0)
    if not gpus:
        return memory
    if len(gpus) == 1:
        low_zero = False
        if not user_set:
            memory[gpus[0]] = int(memory[gpus[0]] * 0.9)  # keep 10% for activations
    no_split = _as_list(no_split_module_classes)
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_gpu = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))
    # Each GPU gets a little more than its share (the largest unsplittable block, or the mean layer),
    # otherwise the last layers spill to the CPU.
    first_of_class: dict[str, int] = {}  # the size of the first block of each unsplittable class
    for name in sizes:
        if name and no_split:
            class_name = model.get_submodule(name).__class__.__name__ if _is_module(model, name) else ""
            if class_name in no_split:
                first_of_class.setdefault(class_name, sizes[name])
    block = max(first_of_class.values(), default=0)
    modules = _without(_leaves(sizes), sizes)  # the leaves of the sizes are tensors; drop them
    leaves = _leaves(modules)
    mean_leaf = int(sum(modules[n] for n in leaves) / max(len(leaves), 1))
    per_gpu += int(1.25 * max(block, mean_leaf))
    for index in gpus[:-1]:
        memory[index] = min(memory[0] if low_zero and index == 0 else per_gpu, memory[index])
    if low_zero:
        memory[0] = min(max(0, sizes[""] - sum(memory[i] for i in range(1, len(gpus)))), memory[0])
    return memory


def _is_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _leaves(sizes: dict[str, int]) -> list[str]:
    children = defaultdict(int)
    for name in sizes:
        if name and "." in name:
            children[name.rsplit(".", 1)[0]] += 1
    return [name for name in sizes if name and children[name] == 0]


def _without(names: list[str], sizes: dict[str, int]) -> dict[str, int]:
    dropped = set(names)
    return {n: v for n, v in sizes.items() if n not in dropped}


def _as_list(names: list[str] | str | None) -> list[str]:
    if names is None:
        return []
    return [names] if isinstance(names, str) else list(names)


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """``(total size, (largest layer size, its names))``, using the model's ``_no_split_modules`` if it has them."""
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    top = (
        list(model.named_parameters(recurse=False))
        + list(model.named_children())
        + list(model.named_buffers(recurse=False))
    )
    return sizes[""], get_max_layer_size(top, sizes, no_split)


# -- tied weights ----------------------------------------------------------------------------------
def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that are one parameter (``lm_head.weight`` is ``embed.weight``), each sorted.

    Example::

        model.linear2.weight = model.linear1.weight
        find_tied_parameters(model)  # [["linear1.weight", "linear2.weight"]]
    """
    names_by_param: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param[id(param)].append(name)
    return [sorted(names) for names in names_by_param.values() if len(names) > 1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Makes each group of ``tied_params`` one parameter again: the first that is not on the meta device.

    A group entirely on meta is tied to its first member (the reference leaves it untied), so
    that the tie is still known when its weights are loaded later.
    """
    for group in tied_params:
        members = [_get(model, n) for n in group]
        keep = next((p for p in members if p.device.type != "meta"), members[0])
        for name in group:
            owner, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(owner), attribute, keep)


def _get(model: nn.Module, name: str) -> torch.Tensor:
    owner, _, attribute = name.rpartition(".")
    return getattr(model.get_submodule(owner), attribute)


def device_of(name: str, device_map: dict[str, Device]) -> Device:
    """The device ``device_map`` gives the tensor or module ``name`` (its longest mapped prefix)."""
    candidate = name
    while candidate not in device_map:
        if candidate == "":
            raise ValueError(f"The `device_map` does not contain the module {name}.")
        candidate = candidate.rpartition(".")[0]
    return device_map[candidate]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: dict[str, Device]) -> None:
    """Warns about each tied group whose members ``device_map`` puts on different devices."""
    for group in tied_params:
        devices = {name: device_of(name, device_map) for name in group}
        if len(set(devices.values())) > 1:
            logger.warning(
                f"Tied parameters are on different devices: {devices}. "
                "Please modify your custom device map or set `device_map='auto'`. "
            )


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a transformers model's config says some weights should be tied (word embeddings, encoder/decoder)."""
    if "PreTrainedModel" not in [c.__name__ for c in inspect.getmro(model.__class__)]:
        return False
    config = getattr(model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    decoder = get_text_config(decoder=True) if get_text_config is not None else config
    # A PreTrainedModel (known by class name above, so transformers need not be imported) has get_output_embeddings.
    word_embeddings = bool(
        decoder is not None and getattr(decoder, "tie_word_embeddings", False) and model.get_output_embeddings()  # pyright: ignore[reportCallIssue]
    )
    encoder_decoder = bool(
        getattr(config, "is_encoder_decoder", False) and getattr(config, "tie_encoder_decoder", False)
    )
    return word_embeddings or encoder_decoder or any(hasattr(m, "_tie_weights") for m in model.modules())
