"""Model weight files for use outside accel, in the layout the Hugging Face ecosystem reads.

One file (``model.safetensors``) when the weights fit in ``max_shard_size``, otherwise
``model-00001-of-0000N.safetensors`` shards plus ``model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {tensor name: shard file}}``).
With ``safe_serialization=False`` the same with ``pytorch_model*.bin`` files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import torch

from . import constants as C
from .errors import CheckpointNotFoundError, CorruptCheckpointError
from .fsio import replace_file_atomically, torch_save, write_json
from .safe_load import load_torch_file
from .safetensors_io import dedupe, read_safetensors, safetensors_metadata, tensor_nbytes, write_safetensors

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(size: int | str) -> int:
    """Bytes from ``10GB`` (10**9 units, as Hugging Face counts), ``512MiB`` (2**20) or an int.

    Example: ``parse_size("10GB") == 10_000_000_000``.
    """
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}.")
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(size))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"max_shard_size={size!r} is not a size; use an int (bytes) or e.g. '10GB', '500MB', '2GiB'.")
    return int(float(match.group(1)) * _UNITS[unit])


def split_into_shards(tensors: Mapping[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Greedy, in order: a shard is closed when the next tensor would pass ``max_bytes``.

    A tensor larger than ``max_bytes`` gets a shard of its own (tensors are never split).
    """
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor_nbytes(tensor)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def _stale_weight_file(name: str, prefix: str, ext: str) -> bool:
    return (
        bool(re.fullmatch(rf"{re.escape(prefix)}(-\d{{5}}-of-\d{{5}})?{re.escape(ext)}", name))
        or name == f"{prefix}{ext}.index.json"
    )


def write_model_files(
    state_dict: Mapping[str, Any],
    save_directory: str,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[str]:
    """Writes a full state dict as model weight files (each file replaced atomically); returns their names.

    Example::

        write_model_files(model.state_dict(), "export", max_shard_size="2GB")
    """
    max_bytes = parse_size(max_shard_size)
    bad: list[str] = []
    os.makedirs(save_directory, exist_ok=True)
    if safe_serialization:
        unique, aliases = dedupe(state_dict)
        prefix, ext = C.MODEL_NAME, C.SAFE_MODEL_EXT
    else:
        bad = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]  # get_extra_state values
        unique, aliases = dict(state_dict), {}
        prefix, ext = C.PICKLE_MODEL_NAME, ".bin"
    unique = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in unique.items()}
    tensors_only = {k: v for k, v in unique.items() if isinstance(v, torch.Tensor)}
    shards = split_into_shards(tensors_only, max_bytes) if tensors_only else [{}]
    if not safe_serialization and bad:  # non-tensor entries ride along in the first shard
        shards[0].update({k: unique[k] for k in bad})
    total = len(shards)
    names = [f"{prefix}{ext}"] if total == 1 else [f"{prefix}-{i + 1:05d}-of-{total:05d}{ext}" for i in range(total)]
    for name, shard in zip(names, shards, strict=True):
        path = os.path.join(save_directory, name)
        if safe_serialization:
            meta = safetensors_metadata(aliases if total == 1 else {})
            replace_file_atomically(lambda tmp, shard=shard, meta=meta: write_safetensors(shard, tmp, meta), path)
        else:
            replace_file_atomically(lambda tmp, shard=shard: torch_save(shard, tmp), path)
    index_name = C.SAFE_INDEX_NAME if safe_serialization else C.PICKLE_INDEX_NAME
    if total > 1:
        index: dict[str, Any] = {
            "metadata": {"total_size": sum(tensor_nbytes(t) for t in tensors_only.values())},
            "weight_map": {key: name for name, shard in zip(names, shards, strict=True) for key in shard},
        }
        if aliases:
            index["metadata"]["accel_aliases"] = dict(aliases)
        replace_file_atomically(lambda tmp: write_json(tmp, index), os.path.join(save_directory, index_name))
        names.append(index_name)
    for name in os.listdir(save_directory):  # weight files of an earlier save that the new one replaces
        if name not in names and _stale_weight_file(name, prefix, ext):
            os.remove(os.path.join(save_directory, name))
    return names


def read_model_files(path: str, allow_unsafe_pickle: bool | None = None) -> dict[str, torch.Tensor]:
    """The full state dict from a weight file, or a folder written by ``write_model_files`` (sharded or not)."""
    if os.path.isfile(path):
        if path.endswith(C.SAFE_MODEL_EXT):
            return read_safetensors(path)[0]
        return load_torch_file(path, allow_unsafe_pickle)
    for index_name, single in (
        (C.SAFE_INDEX_NAME, f"{C.MODEL_NAME}{C.SAFE_MODEL_EXT}"),
        (C.PICKLE_INDEX_NAME, f"{C.PICKLE_MODEL_NAME}.bin"),
    ):
        index_path = os.path.join(path, index_name)
        if os.path.isfile(index_path):
            try:
                with open(index_path, encoding="utf-8") as handle:
                    index = json.load(handle)
                weight_map = index["weight_map"]
            except (ValueError, KeyError) as error:
                raise CorruptCheckpointError(
                    f"{index_path} is not a valid index ({error}); save the model again."
                ) from error
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                state.update(read_model_files(os.path.join(path, shard), allow_unsafe_pickle))
            missing = sorted(set(weight_map) - set(state))
            if missing:
                raise CorruptCheckpointError(f"{index_path} lists tensors that no shard holds: {missing[:5]}.")
            for alias, kept in index.get("metadata", {}).get("accel_aliases", {}).items():
                state[alias] = state[kept]
            return state
        if os.path.isfile(os.path.join(path, single)):
            return read_model_files(os.path.join(path, single), allow_unsafe_pickle)
    raise CheckpointNotFoundError(
        f"No model weights in {path}: expected model.safetensors, an index file, or pytorch_model.bin."
    )


def load_model(model: torch.nn.Module, path: str, strict: bool = True, allow_unsafe_pickle: bool | None = None) -> Any:
    """Loads weights written by ``save_model`` / ``write_model_files`` into ``model``.

    Example::

        model = MyModel()
        load_model(model, "export")  # model.safetensors or the sharded index
    """
    return model.load_state_dict(read_model_files(path, allow_unsafe_pickle), strict=strict)
