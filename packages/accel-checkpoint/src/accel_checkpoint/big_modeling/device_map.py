"""Device maps: which device each part of a model goes to (GPUs first, then the CPU, then the disk).

``infer_auto_device_map`` walks the model's top-level parts in order and fills one device after
the other, splitting a part into its children when it does not fit (unless its class is in
``no_split_module_classes``), keeping tied weights on one device, and reserving on the main
devices room for the largest layer, which an offloaded layer needs when it runs. It makes the
same choices as the reference's function of that name.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .sizes import (
    CustomDtype,
    Device,
    _as_list,
    compute_module_sizes,
    find_tied_parameters,
    get_max_layer_size,
    get_max_memory,
)

logger = logging.getLogger(__name__)


def _children(module: Any) -> list[tuple[str, Any]]:
    """What a part splits into: its direct parameters, then its child modules (nothing for a tensor)."""
    if isinstance(module, torch.Tensor) or not isinstance(module, nn.Module):
        return []
    return list(module.named_parameters(recurse=False)) + list(module.named_children())


def _can_split(module: Any, no_split: list[str]) -> bool:
    return (
        isinstance(module, nn.Module)
        and bool(list(module.named_children()))
        and module.__class__.__name__ not in no_split
    )


def _inside(name: str, parameter: str) -> bool:
    # "a.b" contains "a.b.weight" but not "a.bc.weight".
    return f"{name}." in f"{parameter}."


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Device, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: str | torch.dtype | CustomDtype | None = None,
    special_dtypes: dict[str, str | torch.dtype | CustomDtype] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> OrderedDict[str, Device]:
    """A device map for ``model`` within ``max_memory`` (default: the free memory of each device now).

    Works on a model on the meta device. Parts that fit nowhere go to ``"disk"``. clean_result:
    merge the children of a module that all landed on one device into that module's entry.
    ``fallback_allocation`` (search deeper for a part that fits an otherwise empty device) is not
    available in accel and raises.

    Example::

        with init_empty_weights():
            model = MyModel()
        device_map = infer_auto_device_map(model, max_memory={"cpu": "2GB"}, no_split_module_classes=["Block"])
    """
    if fallback_allocation:
        raise NotImplementedError(
            "infer_auto_device_map(fallback_allocation=True) is not available in accel; leave it False."
        )
    memory = get_max_memory(max_memory)
    no_split = _as_list(no_split_module_classes)
    devices: list[Device] = list(memory) + ([] if "disk" in memory else ["disk"])
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    main_devices = ["mps"] if "mps" in gpus else [gpus[0], "cpu"] if gpus else ["cpu"]
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_groups = find_tied_parameters(model)

    queue: list[tuple[str, Any]] = (
        list(model.named_parameters(recurse=False))
        + list(model.named_children())
        + list(model.named_buffers(recurse=False))
    )
    device_map: OrderedDict[str, Device] = OrderedDict()
    used = {d: 0 for d in devices}
    current = 0

    def largest_layer() -> tuple[int, list[str]]:
        return get_max_layer_size([(n, m) for n, m in queue if isinstance(m, nn.Module)], sizes, no_split)

    max_layer, max_layer_names = get_max_layer_size(queue, sizes, no_split)
    while queue:
        name, module = queue.pop(0)
        if verbose:
            print(f"\nTreating module {name}.")
        max_layer_names = [n for n in max_layer_names if n != name and not n.startswith(name + ".")]
        if not max_layer_names:
            max_layer, max_layer_names = largest_layer()
        size = sizes[name]
        # Parameters tied to one inside this part but living outside it must go along.
        tied_outside = [
            p
            for group in tied_groups
            if any(_inside(name, p) for p in group) and not all(_inside(name, p) for p in group)
            for p in group if not _inside(name, p)
        ]  # fmt: skip
        # Each such parameter's part still waiting in the queue (one already placed stays where it is).
        pending = dict(queue)
        tied_pairs = [
            (p, n) for p in tied_outside for n in [next((n for n in pending if p.startswith(n + ".")), None)] if n
        ]
        tied_names = [n for _, n in tied_pairs]
        tied_modules = [pending[n] for n in tied_names]
        size_with_ties = size + sum(sizes[n] - sizes[p] for p, n in tied_pairs)

        device = devices[current]
        limit = None if device == "disk" else memory[device]
        reserved = 0
        if device in main_devices and limit is not None:
            limit, reserved = limit - max_layer, max_layer

        if limit is None or used[device] + size_with_ties <= limit:
            if verbose:
                print(f"Putting {name}{f' and {tied_names}' if tied_names else f' (size={size})'} on {device}.")
            used[device] += size_with_ties
            device_map[name] = device
            for tied in tied_names:
                queue = [(n, m) for n, m in queue if n != tied]
                device_map[tied] = device
            continue

        if tied_names and used[device] + size <= limit:
            # The part fits alone: split one of the tied parts it drags along, if one can be split.
            splittable = next(
                ((n, m) for n, m in zip(tied_names, tied_modules, strict=True) if _can_split(m, no_split)), None
            )
            if splittable is not None:
                tied_name, tied_module = splittable
                index = next(i for i, (n, _) in enumerate(queue) if n == tied_name)
                pieces = [(f"{tied_name}.{n}", v) for n, v in _children(tied_module)]
                queue = [(name, module), *queue[:index], *pieces, *queue[index + 1 :]]
                max_layer, max_layer_names = largest_layer()
                continue

        if used[device] + size >= limit and _can_split(module, no_split):
            if verbose:
                print(f"Splitting {name}.")
            queue = [(f"{name}.{n}", v) for n, v in _children(module)] + queue
            max_layer, max_layer_names = largest_layer()
            continue

        if used[device] == 0:
            logger.info(f"No module could be assigned to {device}: {size_with_ties + reserved} bytes would be needed.")
        # Nothing more goes on this device: the reserve for the largest layer counts as used.
        used[device] += reserved
        current += 1
        queue = [(name, module), *queue]

    if clean_result:
        clean_device_map(device_map)  # in place
    if not offload_buffers and gpus:
        _warn_if_offloaded_buffers_do_not_fit(model, device_map, memory, used, dtype, special_dtypes)
    return device_map


def _warn_if_offloaded_buffers_do_not_fit(
    model: nn.Module,
    device_map: dict[str, Device],
    memory: dict[Device, int],
    used: dict[Device, int],
    dtype: Any,
    special_dtypes: Any,
) -> None:
    # Buffers of offloaded parts stay on the execution device (offload_buffers=False): they need room there.
    buffer_sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True)
    offloaded = sum(buffer_sizes.get(n, 0) for n, d in device_map.items() if d in ("cpu", "disk"))
    if offloaded and not any(memory[d] >= offloaded + used.get(d, 0) for d in memory if d not in ("cpu", "disk")):
        warnings.warn(
            f"Current model requires {offloaded} bytes of buffer for offloaded layers, which seems does not fit any "
            "GPU's remaining memory. If you are experiencing a OOM later, please consider using offload_buffers=True.",
            stacklevel=3,
        )


def clean_device_map(device_map: dict[str, Device], module_name: str = "") -> dict[str, Device]:
    """Merges the entries under ``module_name`` that all share one device into one entry (recursively); in place."""
    prefix = f"{module_name}." if module_name else ""
    values = [v for k, v in device_map.items() if k.startswith(prefix)]
    if len(values) > 1 and len(set(values)) == 1:
        for key in [k for k in device_map if k.startswith(prefix)]:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {
        ".".join(k.split(".")[:depth]) for k in device_map if k.startswith(prefix) and len(k) > len(module_name)
    }
    for child in children:
        clean_device_map(device_map, module_name=child)
    return device_map


def check_device_map(model: nn.Module, device_map: dict[str, Device]) -> None:
    """Raises ValueError naming the tensors ``device_map`` gives no device; warns about keys that name nothing."""
    modules = dict(model.named_modules())
    unknown = [k for k in device_map if k != "" and k not in modules and not _is_tensor_name(model, k)]
    if unknown:
        warnings.warn(
            f"The following device_map keys do not match any submodules in the model: {unknown}",
            UserWarning,
            stacklevel=2,
        )
    if "" in device_map:
        return
    uncovered = [n for n in model.state_dict() if not any(n == k or n.startswith(k + ".") for k in device_map)]
    if uncovered:
        raise ValueError(
            f"The device_map provided does not give any device for the following parameters: {', '.join(uncovered)}"
        )


def _is_tensor_name(model: nn.Module, name: str) -> bool:
    owner, _, attribute = name.rpartition(".")
    try:
        module = model.get_submodule(owner)
    except AttributeError:
        return False
    return attribute in module._parameters or attribute in module._buffers
