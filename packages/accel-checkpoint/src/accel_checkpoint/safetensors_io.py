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
from typing import TYPE_CHECKING, Any, Protocol

from .errors import CheckpointNotFoundError, CorruptCheckpointError
from .fsio import durable_open

if TYPE_CHECKING:
    import torch

ALIASES_KEY = "accel.aliases"


class SupportsWrite(Protocol):
    """A binary file, or anything that takes bytes like one (``file_sink.FileSink``)."""

    def write(self, data: Any, /) -> Any: ...


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


_CODES = {code: name for name, code in _DTYPES.items()}
_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
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


def write_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str, metadata: Mapping[str, str] | None = None, durable: bool = True
) -> int:
    """Writes CPU tensors (no two names for one storage: see ``dedupe``) to ``path`` (fsynced when ``durable``).

    Returns the file size. Example::

        unique, aliases = dedupe(model.state_dict())
        write_safetensors(unique, "model.safetensors", {"format": "pt"})
    """
    if sys.byteorder != "little":  # safetensors is little-endian; let the library convert
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=dict(metadata or {}))
        return os.path.getsize(path)
    with durable_open(path, durable=durable) as handle:
        return write_safetensors_to(handle, tensors, metadata)


def write_safetensors_to(
    handle: SupportsWrite, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> int:
    """Writes the safetensors bytes of CPU tensors to an open binary ``handle`` (little-endian machines only:
    ``write_safetensors`` handles the others); returns the number of bytes written."""
    import torch

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
        header[name] = {
            "dtype": _dtype_code(tensor, name),
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
        ordered.append(tensor)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the reference writer does
    handle.write(struct.pack("<Q", len(raw)) + raw)
    for tensor in ordered:
        if tensor.numel():
            # An ndarray is a buffer; numpy's stubs declare __buffer__ only for Python >= 3.12.
            handle.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))  # pyright: ignore[reportArgumentType]
    return 8 + len(raw) + offset


_MAX_HEADER = 100 * 2**20  # the reference reader's limit


def _corrupt(path: str, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{path} is truncated or corrupt ({why}). Restore the file from a copy, or load an earlier checkpoint."
    )


def _parse_header(
    path: str, handle: Any, file_size: int
) -> tuple[int, list[tuple[int, int, str, str, list[int]]], dict[str, str]]:
    """Validates a safetensors header like the reference reader: known dtypes, sizes matching
    shapes, tensors tiling the data section exactly, and the file holding all of it."""
    raw = handle.read(8)
    if len(raw) < 8:
        raise _corrupt(path, f"{file_size} bytes, shorter than a header")
    (length,) = struct.unpack("<Q", raw)
    if length > _MAX_HEADER or 8 + length > file_size:
        raise _corrupt(path, f"header length {length} does not fit in {file_size} bytes")
    try:
        header = json.loads(handle.read(length).decode("utf-8"))
        metadata = header.pop("__metadata__", None) or {}
        entries = []
        for name, info in header.items():
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            if dtype not in _CODES or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"bad dtype/shape for {name!r}")
            numel = 1
            for d in shape:
                numel *= d
            if (
                not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end)
                or end - begin != numel * _ITEMSIZE[dtype]
            ):
                raise ValueError(f"offsets of {name!r} do not match its shape")
            entries.append((begin, end, str(name), dtype, list(shape)))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as error:
        raise _corrupt(path, f"invalid header: {error}") from None
    entries.sort()
    position = 0
    for begin, end, name, _dtype, _shape in entries:
        if begin != position:
            raise _corrupt(path, f"tensor {name!r} does not start where the previous one ends")
        position = end
    if 8 + length + position != file_size:
        raise _corrupt(path, f"the header describes {8 + length + position} bytes but the file has {file_size}")
    return 8 + length, entries, {str(k): str(v) for k, v in metadata.items()}


def read_safetensors(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Loads every tensor of a safetensors file on the CPU, with aliases restored.

    Tensors are views of a private (copy-on-write) memory map of the file: loading into a model
    copies each byte once, as the reference reader does, and writing to them never changes the file.
    Raises CheckpointNotFoundError / CorruptCheckpointError naming the file.
    """
    import mmap

    import torch

    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"Missing file {path}: the checkpoint is incomplete or was written differently.")
    with open(path, "rb") as handle:
        file_size = os.fstat(handle.fileno()).st_size
        start, entries, metadata = _parse_header(path, handle, file_size)
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) if file_size > start else None
    tensors: dict[str, torch.Tensor] = {}
    for begin, end, name, code, shape in entries:
        dtype = getattr(torch, _CODES[code])
        offset = start + begin
        if end == begin:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        assert mapped is not None  # a tensor with bytes: the file extends past its header
        if offset % _ITEMSIZE[code]:  # misaligned (foreign writer): copy rather than view
            tensors[name] = torch.frombuffer(bytearray(mapped[offset : start + end]), dtype=dtype).reshape(shape)
        else:
            tensors[name] = torch.frombuffer(
                mapped, dtype=dtype, count=(end - begin) // _ITEMSIZE[code], offset=offset
            ).reshape(shape)
    aliases = json.loads(metadata.get(ALIASES_KEY, "{}"))
    for alias, kept in aliases.items():
        if kept not in tensors:
            raise _corrupt(path, f"alias {alias!r} points to missing tensor {kept!r}")
        tensors[alias] = tensors[kept]
    return tensors, metadata


def safetensors_metadata(aliases: Mapping[str, str]) -> dict[str, str]:
    """The file metadata: ``format=pt`` (what transformers checks) and our alias table when needed."""
    metadata = {"format": "pt"}
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(dict(aliases), sort_keys=True)
    return metadata
