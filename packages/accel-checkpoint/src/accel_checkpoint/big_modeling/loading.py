"""Load a checkpoint (one file, an index, or a folder of shards) into a model, tensor by tensor, onto its device-map
devices.

Tensors mapped to ``"disk"`` go to the offload folder instead and stay on the meta device in the model.

Example::

    with init_empty_weights():
        model = MyModel()
    load_checkpoint_in_model(model, "weights/", device_map={"": "cpu"}, dtype="bfloat16")
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any

import torch
from torch import nn

from ..file_names import SAFE_WEIGHTS_NAME, WEIGHTS_NAME
from .offload import OffloadedWeightsLoader, offload_weight, save_offload_index, set_module_tensor_to_device
from .sizes import (
    Device,
    _as_dtype,
    check_tied_parameters_on_same_device,
    device_of,
    find_tied_parameters,
    retie_parameters,
)

logger = logging.getLogger(__name__)


def _checkpoint_files(checkpoint: str | os.PathLike[str]) -> list[str]:
    """The weight files of a checkpoint: a file, an ``.index.json``, or a folder holding either."""
    checkpoint = os.fspath(checkpoint)
    index_file = None
    if os.path.isfile(checkpoint):
        if not checkpoint.endswith(".json"):
            return [checkpoint]
        index_file = checkpoint
    elif os.path.isdir(checkpoint):
        for whole in (WEIGHTS_NAME, SAFE_WEIGHTS_NAME):
            if os.path.isfile(os.path.join(checkpoint, whole)):
                return [os.path.join(checkpoint, whole)]
        indexes = [f for f in os.listdir(checkpoint) if f.endswith(".index.json")]
        if len(indexes) != 1:
            raise ValueError(
                f"{checkpoint} is not a folder containing a `.index.json` file or a {WEIGHTS_NAME} or a "
                f"{SAFE_WEIGHTS_NAME} file"
                if not indexes
                else f"{checkpoint} containing more than one `.index.json` file, delete the irrelevant ones."
            )
        index_file = os.path.join(checkpoint, indexes[0])
    else:
        raise ValueError(
            "`checkpoint` should be the path to a file containing a whole state dict, or the index of a sharded "
            f"checkpoint, or a folder containing a sharded checkpoint or the whole state dict, but got {checkpoint}."
        )
    with open(index_file) as f:
        index = json.load(f)
    weight_map = index.get("weight_map", index)
    folder = os.path.dirname(index_file)
    return [os.path.join(folder, name) for name in sorted(set(weight_map.values()))]


def load_state_dict(checkpoint_file: str, device_map: dict[str, Device] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of one weight file: safetensors, or a torch file read with ``weights_only=True``.

    With a ``device_map`` whose only device is not the disk, tensors are read straight onto it.
    """
    mapped = device_map or {}
    devices = set(mapped.values()) - {"disk"}
    target = next(iter(devices)) if len(devices) == 1 and len(set(mapped.values())) == 1 else "cpu"
    if checkpoint_file.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(
            checkpoint_file, framework="pt", device=str(target) if not isinstance(target, int) else target
        ) as f:
            if (f.metadata() or {"format": "pt"}).get("format", "pt") != "pt":
                raise ValueError(
                    f"The checkpoint {checkpoint_file} was not saved from PyTorch (format {f.metadata()['format']})."
                )
            return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 - safe_open is not iterable
    from ..safe_load import load_torch_file

    state_dict = load_torch_file(checkpoint_file)
    return {k: v.to(target) for k, v in state_dict.items()} if target != "cpu" else state_dict


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: dict[str, Device] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: list[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Loads ``checkpoint`` into ``model`` (which may be on meta), each tensor onto its ``device_map`` device.

    Tensors mapped to ``"disk"`` are written to ``offload_folder`` and stay on meta in the model.
    dtype: cast floating tensors (except in ``keep_in_fp32_modules`` when casting to fp16).
    offload_state_dict: stage the CPU tensors on disk while loading (lower peak memory).
    Without a device map the whole state dict is loaded as ``set_model_state_dict`` does
    (``full_state_dict`` / ``broadcast_from_rank0`` are its options). Call ``dispatch_model`` after.
    """
    if offload_8bit_bnb:
        raise ValueError("offload_8bit_bnb=True needs bitsandbytes 8-bit models, which accel does not load.")
    tied = find_tied_parameters(model)
    if device_map is not None:
        check_tied_parameters_on_same_device(tied, device_map)
        if "disk" in device_map.values():
            if offload_folder is None:
                raise ValueError(
                    "At least one of the model submodule will be offloaded to disk, please pass along an "
                    "`offload_folder`."
                )
            os.makedirs(offload_folder, exist_ok=True)
    dtype = None if dtype is None else _as_dtype(dtype)
    model_keys = set(model.state_dict())
    buffers = {name for name, _ in model.named_buffers()}
    unexpected: set[str] = set()
    offload_index: dict[str, Any] = {}
    staging = tempfile.mkdtemp() if offload_state_dict and device_map is not None else None
    staged: dict[str, Any] = {}
    for file in _checkpoint_files(checkpoint):
        loaded = load_state_dict(file, device_map=device_map)
        unexpected |= set(loaded) - model_keys
        if device_map is None:
            _load_whole(model, loaded, strict, full_state_dict, broadcast_from_rank0)
            continue
        for name, tensor in loaded.items():
            if name not in model_keys:
                continue
            device = device_of(name, device_map)
            target_dtype = dtype
            if (
                dtype == torch.float16
                and torch.is_floating_point(tensor)
                and keep_in_fp32_modules
                and any(k == name or f"{k}." in name for k in keep_in_fp32_modules)
            ):
                target_dtype = torch.float32
            if target_dtype is not None and torch.is_floating_point(tensor):
                tensor = tensor.to(target_dtype)
            if device == "disk" and (offload_buffers or name not in buffers):
                assert offload_folder is not None  # a "disk" device was refused above without one
                set_module_tensor_to_device(model, name, "meta", value=tensor, dtype=target_dtype)
                offload_weight(tensor, name, offload_folder, index=offload_index)
            elif device == "cpu" and staging is not None:
                set_module_tensor_to_device(model, name, "meta", value=tensor, dtype=target_dtype)
                offload_weight(tensor, name, staging, index=staged)
            else:  # a buffer of a disk part stays in CPU memory unless offload_buffers
                set_module_tensor_to_device(
                    model, name, "cpu" if device == "disk" else device, value=tensor, dtype=target_dtype
                )
        del loaded
    if unexpected:
        message = (
            f"Some weights of the model checkpoint at {checkpoint} were not used when initializing "
            f"{model.__class__.__name__}: {unexpected}."
        )
        if strict and device_map is not None:
            raise ValueError(message)
        logger.warning(message)
    if offload_index and offload_folder is not None:  # an index is only written with a folder
        save_offload_index(offload_index, offload_folder)
    if staging is not None:
        weights = OffloadedWeightsLoader(save_folder=staging, index=staged)
        for name in staged:
            set_module_tensor_to_device(model, name, "cpu", value=weights[name], dtype=weights[name].dtype)
        shutil.rmtree(staging)
    retie_parameters(model, tied)


def _load_whole(model: nn.Module, state_dict: dict[str, Any], strict: bool, full: bool, broadcast: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if broadcast and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        state_dict = {}
    options = StateDictOptions(full_state_dict=full, strict=strict, broadcast_from_rank0=broadcast)
    set_model_state_dict(model, state_dict, options=options)
