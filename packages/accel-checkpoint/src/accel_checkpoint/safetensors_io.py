"""Reading and writing safetensors files.

The writer streams each tensor's bytes straight from its memory into the file (no intermediate
``bytes`` copy as ``safetensors.torch.save_file`` makes), then fsyncs. Files are read with the
safetensors library itself, so what we write is checked by the reference reader in the tests.

Tied or shared weights: safetensors refuses two names for one storage. Identical views (the usual
tied embedding / LM head) are written once; the other names are kept in the file's metadata under
``accel.aliases`` and restored on load, so ``load_state_dict(strict=True)`` still works.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import CorruptCheckpointError, CheckpointNotFoundError
from .fsio import durable_open

if TYPE_CHECKING:
    import torch

ALIASES_KEY = "accel.aliases"

_DTYPES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
}


def _dtype_code(tensor: torch.Tensor, name: str) -> str:
    key = str(tensor.dtype).replace("torch.", "")
    if key not in _DTYPES:
        raise TypeError(
            f"Tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot store. "
            "Convert it, or save with safe_serialization=False."
        )
    return _DTYPES[key]


def dedupe(state_dict: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Splits a state dict into unique tensors and ``alias -> kept name`` for identical views.

    Raises TypeError for non-tensor entries (a module's ``get_extra_state`` objects), naming them.
    """
    import torch

    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    bad = [name for name, value in state_dict.items() if not isinstance(value, torch.Tensor)]
    if bad:
        raise TypeError(
            f"These state-dict entries are not tensors and cannot go into a safetensors file: {bad[:5]}. "
            "Save with safe_serialization=False (they will then need allow_unsafe_pickle=True to load "
            "if they are not plain Python values)."
        )
    for name, tensor in state_dict.items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            unique[name] = tensor
            continue
        key = (
            tensor.device,
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
        )
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = tensor
    return unique, aliases


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: str, metadata: Mapping[str, str] | None = None) -> int:
    """Writes CPU tensors (no two names for one storage: see ``dedupe``) to ``path``, fsynced.

    Returns the file size. Example::

        unique, aliases = dedupe(model.state_dict())
        write_safetensors(unique, "model.safetensors", {"format": "pt"})
    """
    import torch

    if sys.byteorder != "little":  # safetensors is little-endian; let the library convert
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=dict(metadata or {}))
        return os.path.getsize(path)

    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    ordered: list[torch.Tensor] = []
    for name, tensor in tensors.items():
        if tensor.device.type != "cpu":
            raise ValueError(f"write_safetensors needs CPU tensors; {name!r} is on {tensor.device}.")
        tensor = tensor.detach()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        size = tensor_nbytes(tensor)
        header[name] = {"dtype": _dtype_code(tensor, name), "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
        ordered.append(tensor)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the reference writer does
    with durable_open(path) as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for tensor in ordered:
            if tensor.numel():
                handle.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return 8 + len(raw) + offset


def read_safetensors(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Loads every tensor of a safetensors file on the CPU, with aliases restored.

    Raises CheckpointNotFoundError / CorruptCheckpointError naming the file.
    """
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"Missing file {path}: the checkpoint is incomplete or was written differently.")
    try:
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(path, framework="pt", device="cpu") as handle:
            metadata = dict(handle.metadata() or {})
            for name in handle.keys():
                tensors[name] = handle.get_tensor(name)
    except Exception as error:  # safetensors raises its own SafetensorError / OSError variants
        raise CorruptCheckpointError(
            f"{path} is truncated or corrupt ({type(error).__name__}: {error}). Restore the file from a copy, "
            "or load an earlier checkpoint."
        ) from error
    aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
    for alias, kept in aliases.items():
        tensors[alias] = tensors[kept]
    return tensors, metadata


def safetensors_metadata(aliases: Mapping[str, str]) -> dict[str, str]:
    """The file metadata: ``format=pt`` (what transformers checks) and our alias table when needed."""
    metadata = {"format": "pt"}
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(dict(aliases), sort_keys=True)
    return metadata
