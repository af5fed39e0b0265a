"""Dispatch mode: the group's first process reads every batch and sends each process its share.

Wire format, chosen for speed (see ``bench/dataloader_overhead.py``): one message per process and
step, a flat ``uint8`` buffer holding a small pickled skeleton of the batch (its structure and
every non-tensor leaf, e.g. a list of strings) followed by the raw bytes of its tensors, each
aligned to 16 bytes. The receiver rebuilds tensors as views of the buffer without copying, so any
shape and dtype goes through and shapes may change from batch to batch. A step costs two
collectives: a broadcast of a small header (kind, real samples, every share's size) and a scatter
of the shares padded to the largest. Pickling tensors instead would go through ``torch.save``
for every storage, several times slower on small batches.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import torch

from .comm import Comm

_ALIGN = 16
_DATA, _END, _ERROR = 0, 1, 2


class _TensorRef:
    """Stands for the ``index``-th tensor of the buffer inside the pickled skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (_TensorRef, (self.index,))


def _strip(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _TensorRef(len(tensors) - 1)
    if isinstance(obj, Mapping):
        items = {k: _strip(v, tensors) for k, v in obj.items()}
        return items if type(obj) is dict else _restore_mapping(obj, items)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_strip(v, tensors) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_strip(v, tensors) for v in obj)
    return obj


def _restore_mapping(obj: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    try:
        return type(obj)(items)
    except TypeError:
        return items


def _fill(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _TensorRef):
        return tensors[obj.index]
    if isinstance(obj, Mapping):
        items = {k: _fill(v, tensors) for k, v in obj.items()}
        return items if type(obj) is dict else _restore_mapping(obj, items)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_fill(v, tensors) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def encode(obj: Any) -> torch.Tensor:
    """``obj`` as one CPU ``uint8`` tensor (see the module docstring for the layout)."""
    tensors: list[torch.Tensor] = []
    skeleton = _strip(obj, tensors)
    flat = [t.detach().reshape(-1).contiguous().cpu() for t in tensors]
    metas = []
    offset = 0
    for t, f in zip(tensors, flat):
        nbytes = f.numel() * f.element_size()
        metas.append((t.dtype, tuple(t.shape), offset, nbytes))
        offset = _aligned(offset + nbytes)
    head = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
    start = _aligned(8 + len(head))
    buf = torch.empty(start + offset, dtype=torch.uint8)
    buf[:8] = torch.frombuffer(bytearray(len(head).to_bytes(8, "little")), dtype=torch.uint8)
    buf[8 : 8 + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    for f, (_, _, off, nbytes) in zip(flat, metas):
        if nbytes:
            buf[start + off : start + off + nbytes] = f.view(torch.uint8)
    return buf


def decode(buf: torch.Tensor) -> Any:
    """Inverse of ``encode``; tensors are views of ``buf`` (on ``buf``'s device)."""
    host = buf if buf.device.type == "cpu" else buf[:8].cpu()
    length = int.from_bytes(host[:8].numpy().tobytes(), "little")
    host = buf[: 8 + length].cpu()
    skeleton, metas = pickle.loads(host[8 : 8 + length].numpy().tobytes())
    start = _aligned(8 + length)
    tensors = []
    for dtype, shape, off, nbytes in metas:
        raw = buf[start + off : start + off + nbytes]
        tensors.append(raw.view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype, device=buf.device))
    return _fill(skeleton, tensors)


class DispatchError(RuntimeError):
    """Process 0 of the data group failed while reading; raised on every other process too."""


class Dispatcher:
    """Sends (first process) or receives (others) one share of each step.

    Header: ``[kind, real, size_0, ..., size_{n-1}]`` as int64; a size of 0 means "no batch for
    this process at this step" (``even_batches=False``).
    """

    def __init__(self, comm: Comm) -> None:
        self.comm = comm

    def _header(self, kind: int, real: int, sizes: list[int]) -> torch.Tensor:
        return torch.tensor([kind, real, *sizes], dtype=torch.int64)

    def send(self, parts: list[Any | None], real: int) -> None:
        """First process: ``parts[r]`` goes to process ``r`` (``parts[0]`` stays here, unsent)."""
        comm = self.comm
        bufs = [None] + [encode(p) if p is not None else None for p in parts[1:]]
        sizes = [0 if parts[0] is None else 1] + [0 if b is None else b.numel() for b in bufs[1:]]
        comm.broadcast(self._header(_DATA, real, sizes))
        largest = max(sizes[1:], default=0)
        if largest == 0:
            return
        out = torch.empty(largest, dtype=torch.uint8, device=comm.device)
        inputs = [out]
        for b in bufs[1:]:
            if b is None or b.numel() != largest:
                padded = torch.empty(largest, dtype=torch.uint8)
                if b is not None:
                    padded[: b.numel()] = b
                b = padded
            inputs.append(b.to(comm.device))
        comm.scatter(out, inputs)

    def end(self) -> None:
        self.comm.broadcast(self._header(_END, -1, [0] * self.comm.size))

    def error(self, exc: BaseException) -> None:
        """Tells the others that reading failed (they raise ``DispatchError``)."""
        message = f"{type(exc).__name__}: {exc}"[:2000]
        self.comm.broadcast(self._header(_ERROR, -1, [0] * self.comm.size))
        payload = torch.frombuffer(bytearray(message.encode().ljust(2048, b" ")), dtype=torch.uint8)
        self.comm.broadcast(payload)

    def receive(self) -> tuple[str, Any | None, int]:
        """Other processes: ``("data", share or None, real)``, ``("end", None, -1)``; raises on error."""
        comm = self.comm
        header = comm.broadcast(torch.empty(2 + comm.size, dtype=torch.int64)).cpu().tolist()
        kind, real, sizes = header[0], header[1], header[2:]
        if kind == _END:
            return "end", None, -1
        if kind == _ERROR:
            payload = comm.broadcast(torch.empty(2048, dtype=torch.uint8)).cpu()
            message = payload.numpy().tobytes().decode(errors="replace").rstrip()
            raise DispatchError(f"Process 0 of the data group failed while reading the data: {message}")
        largest = max(sizes[1:], default=0)
        if largest == 0:
            return "data", None, real
        out = torch.empty(largest, dtype=torch.uint8, device=comm.device)
        comm.scatter(out, None)
        mine = sizes[comm.rank]
        return "data", (decode(out[:mine]) if mine else None), real
