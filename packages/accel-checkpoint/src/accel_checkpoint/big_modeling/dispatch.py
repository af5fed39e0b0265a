"""Run a model bigger than one device: parts on GPUs, the CPU, or the disk, offloaded weights loaded just in time.

Example::

    with init_empty_weights():
        model = MyModel()
    model = load_checkpoint_and_dispatch(
        model, "checkpoint_folder", device_map="auto", max_memory={0: "10GB", "cpu": "30GB"},
        no_split_module_classes=["Block"], offload_folder="offload")
    output = model(inputs)   # offloaded blocks are loaded to the GPU as they run
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from .device_map import check_device_map, infer_auto_device_map
from .hooks import attach_io_hook, attach_offload_hook, guard_moves
from .loading import load_checkpoint_in_model
from .offload import (
    INDEX_NAME,
    OffloadedWeightsLoader,
    extract_submodules_state_dict,
    offload_state_dict,
    set_module_tensor_to_device,
)
from .sizes import Device, device_of, find_tied_parameters, get_balanced_memory, retie_parameters

logger = logging.getLogger(__name__)


# -- dispatching -----------------------------------------------------------------------------------
class _TiedWeights(Mapping[str, torch.Tensor]):
    """A weights map that also answers for the other names of a tied parameter (checkpoints store one)."""

    def __init__(self, weights: Mapping[str, torch.Tensor], tied: list[list[str]]) -> None:
        self.weights = weights
        self.aliases = {name: group for group in tied for name in group}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.weights:
            return self.weights[key]
        for alias in self.aliases.get(key, []):
            if alias in self.weights:
                return self.weights[alias]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


def _attach(
    model: nn.Module,
    device_map: dict[str, Device],
    main_device: Device,
    offloaded: set[Device],
    weights: Mapping[str, torch.Tensor] | None,
    offload_buffers: bool,
    skip_keys: str | list[str] | None,
    preload_module_classes: list[str] | None,
) -> None:
    """Places every tensor and attaches the hooks; ``offloaded`` are the devices whose tensors load just in time."""
    tied = find_tied_parameters(model)
    modules = dict(model.named_modules())
    attach_io_hook(model, main_device, skip_keys, io_same_device=True)
    for name, device in device_map.items():
        if name and name in modules:
            attach_io_hook(modules[name], main_device if device in offloaded else device, skip_keys)
    preload = set(preload_module_classes or [])
    just_in_time: dict[str, list[str]] = {}
    tensors = [(n, t, False) for n, t in model.named_parameters(remove_duplicate=False)]
    tensors += [(n, t, True) for n, t in model.named_buffers(remove_duplicate=False)]
    for name, tensor, is_buffer in tensors:
        device = device_of(name, device_map)
        if device in offloaded and (offload_buffers or not is_buffer):
            owner = name.rpartition(".")[0]
            # A module of a preload class loads its whole subtree when it runs.
            for ancestor in _ancestors(owner):
                if modules[ancestor].__class__.__name__ in preload:
                    owner = ancestor
                    break
            just_in_time.setdefault(owner, []).append(name[len(owner) + 1 :] if owner else name)
            if tensor.device.type != "meta":
                set_module_tensor_to_device(model, name, "meta")
            continue
        target = main_device if device in offloaded else device
        if tensor.device.type == "meta":
            if weights is None:
                raise ValueError(
                    f"{name} is on the meta device and no weights were given for it: load a checkpoint first."
                )
            set_module_tensor_to_device(model, name, target, value=_TiedWeights(weights, tied)[name])
        elif tensor.device != torch.device(target):
            set_module_tensor_to_device(model, name, target)
    if just_in_time:
        if weights is None:
            raise ValueError("Offloaded tensors need their weights (a state_dict or an offload folder).")
        tied_weights = _TiedWeights(weights, tied)
        for owner, names in just_in_time.items():  # offloaded tensors all run on the main device
            attach_offload_hook(modules[owner], names, tied_weights, f"{owner}." if owner else "", main_device)
    retie_parameters(model, tied)


def _ancestors(name: str) -> list[str]:
    """``"a.b.c"`` -> ``["", "a", "a.b", "a.b.c"]``: outermost first, so the outermost preload module wins."""
    parts = name.split(".") if name else []
    return [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]


def dispatch_model(
    model: nn.Module,
    device_map: dict[str, Device],
    main_device: Device | None = None,
    state_dict: dict[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: dict[str, Any] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Makes ``model`` run spread over the devices of ``device_map`` (which may name ``"cpu"`` and ``"disk"``).

    main_device: where offloaded parts run and the model's inputs go (default: the first device
    that is not "cpu" or "disk", else "cpu"). With a GPU as main device, "cpu" parts are offloaded
    too (kept in CPU memory, copied to the GPU as they run). offload_dir: where "disk" weights are
    (written there now unless it has an ``index.json``). Sets ``model.hf_device_map``.
    """
    check_device_map(model, device_map)
    devices = set(device_map.values())
    if len(devices) == 1 and "disk" not in devices and not force_hooks:
        model.to(next(iter(devices)))
        _record_device_map(model, device_map)
        return model
    if main_device is None:
        real = [d for d in device_map.values() if d not in ("cpu", "disk")]
        main_device = real[0] if real else "cpu"
    offloaded: set[Device] = {"disk"} if main_device in ("cpu", "mps") else {"cpu", "disk"}
    disk_modules = [n for n, d in device_map.items() if d == "disk"]
    if disk_modules and offload_index is None:
        if offload_dir is None:
            raise ValueError(
                "We need an `offload_dir` to dispatch this model according to this `device_map`, the following "
                f"submodules need to be offloaded: {', '.join(disk_modules)}."
            )
        if not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):
            offload_state_dict(offload_dir, extract_submodules_state_dict(model.state_dict(), disk_modules))
    cpu_modules = [n for n, d in device_map.items() if d == "cpu"]
    if "cpu" in offloaded and state_dict is None and cpu_modules:
        state_dict = {k: v.to("cpu") for k, v in extract_submodules_state_dict(model.state_dict(), cpu_modules).items()}
    weights = None
    if state_dict is not None or disk_modules or offload_index is not None:
        weights = OffloadedWeightsLoader(
            state_dict=state_dict or {}, save_folder=offload_dir if disk_modules else None, index=offload_index
        )
    _attach(model, device_map, main_device, offloaded, weights, offload_buffers, skip_keys, preload_module_classes)
    offloaded_here = sorted(str(d) for d in devices & offloaded)
    if offloaded_here:
        logger.warning(
            f"Some parameters are on the meta device because they were offloaded to the {' and '.join(offloaded_here)}."
        )
    guard_moves(model)
    _record_device_map(model, device_map)
    return model


def _record_device_map(model: nn.Module, device_map: Mapping[str, Device]) -> None:
    # The reference's (and transformers') attribute; nn.Module's __setattr__ is typed for tensors and modules.
    model.hf_device_map = dict(device_map)  # pyright: ignore[reportArgumentType]


def cpu_offload(
    model: nn.Module,
    execution_device: Device | None = None,
    offload_buffers: bool = False,
    state_dict: dict[str, torch.Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keeps every weight in CPU memory and copies each module's weights to ``execution_device`` only while it runs.

    execution_device: default, the device of the model's first parameter. state_dict: the CPU
    weights to use (default: a CPU copy of the model's).
    """
    if execution_device is None:
        execution_device = next(iter(model.parameters())).device
    if state_dict is None:
        state_dict = {k: v.to("cpu") for k, v in model.state_dict().items()}
    weights = OffloadedWeightsLoader(state_dict=state_dict)
    _attach(model, {"": "cpu"}, execution_device, {"cpu"}, weights, offload_buffers, None, preload_module_classes)
    guard_moves(model)
    return model


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: Device | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Writes every weight to ``offload_dir`` (unless it already has an index) and reads each module's weights
    from there onto ``execution_device`` only while it runs."""
    if not os.path.isfile(os.path.join(offload_dir, INDEX_NAME)):
        offload_state_dict(offload_dir, model.state_dict())
    if execution_device is None:
        execution_device = next(iter(model.parameters())).device
    weights = OffloadedWeightsLoader(save_folder=offload_dir)
    _attach(model, {"": "disk"}, execution_device, {"disk"}, weights, offload_buffers, None, preload_module_classes)
    guard_moves(model)
    return model


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: str | dict[str, Device] | None = None,
    max_memory: Mapping[Device, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """``load_checkpoint_in_model`` then ``dispatch_model``; ``device_map`` may be computed.

    device_map: a dict, or ``"auto"`` / ``"balanced"`` (spread evenly over the GPUs),
    ``"balanced_low_0"`` (little on GPU 0), ``"sequential"`` (fill devices in order), or None
    (load only, no dispatch).
    """
    if isinstance(device_map, str):
        if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
            raise ValueError(
                "If passing a string for `device_map`, please choose 'auto', 'balanced', 'balanced_low_0' or "
                "'sequential'."
            )
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model,
                max_memory=max_memory,
                no_split_module_classes=no_split_module_classes,
                dtype=dtype,
                low_zero=device_map == "balanced_low_0",
            )
        device_map = infer_auto_device_map(
            model,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=dtype,
            offload_buffers=offload_buffers,
        )
    if offload_state_dict is None:
        offload_state_dict = device_map is not None and "disk" in device_map.values()
    load_checkpoint_in_model(
        model,
        checkpoint,
        device_map=device_map,
        offload_folder=offload_folder,
        dtype=dtype,
        offload_state_dict=offload_state_dict,
        offload_buffers=offload_buffers,
        strict=strict,
        full_state_dict=full_state_dict,
        broadcast_from_rank0=broadcast_from_rank0,
    )
    if device_map is None:
        return model
    return dispatch_model(
        model,
        device_map=device_map,
        offload_dir=offload_folder,
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )
