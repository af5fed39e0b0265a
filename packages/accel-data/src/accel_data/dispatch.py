"""Dispatch mode: the group's first process reads every batch and sends each process its share.

Wire format, chosen for speed (see ``bench/dataloader_overhead.py``): one ``uint8`` slot per
process and step, sent with a single scatter. A slot holds a small header, then a pickled skeleton
of the batch (its structure and every non-tensor leaf, e.g. a list of strings) followed by the raw
bytes of its tensors, each aligned to 16 bytes. The receiver rebuilds tensors as views of the slot
without copying, so any shape and dtype goes through and shapes may change from batch to batch.
Pickling the tensors instead (``broadcast_object_list``) goes through ``torch.save`` for every
storage and costs two collectives per step; on CPU processes the collective's latency is most of
the cost, hence one per step.
"""

from __future__ import annotations

import ctypes
import pickle
from collections.abc import Mapping
from typing import Any

import torch

from .comm import Comm

_ALIGN = 16
_DATA, _END, _ERROR, _GROW = 0, 1, 2, 3


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


def encode(obj: Any, offset: int = 0, size_at_least: int = 0) -> tuple[torch.Tensor, int]:
    """``obj`` as one CPU ``uint8`` tensor, written from ``offset`` on (see the module docstring).

    The buffer is at least ``size_at_least`` long (so it can go out as a fixed-size slot without
    a copy); returns it and the end of the encoded bytes.
    """
    tensors: list[torch.Tensor] = []
    skeleton = _strip(obj, tensors)
    flat = [t.detach().reshape(-1).contiguous().cpu() for t in tensors]
    metas = []
    data = 0
    for t, f in zip(tensors, flat):
        nbytes = f.numel() * f.element_size()
        metas.append((t.dtype, tuple(t.shape), data, nbytes))
        data = _aligned(data + nbytes)
    head = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
    start = _aligned(offset + 8 + len(head))
    end = start + data
    buf = torch.empty(max(end, size_at_least), dtype=torch.uint8)
    buf[offset : offset + 8] = torch.frombuffer(bytearray(len(head).to_bytes(8, "little")), dtype=torch.uint8)
    buf[offset + 8 : offset + 8 + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    for f, (_, _, off, nbytes) in zip(flat, metas):
        if nbytes:
            buf[start + off : start + off + nbytes] = f.view(torch.uint8)
    return buf, end


def _bytes(t: torch.Tensor) -> bytes:
    """The bytes of a 1-d ``uint8`` tensor (without numpy, which torch does not require)."""
    t = t.detach().cpu().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel()) if t.numel() else b""


def decode(buf: torch.Tensor, offset: int = 0) -> Any:
    """Inverse of ``encode``; tensors are views of ``buf`` (on ``buf``'s device)."""
    length = int.from_bytes(_bytes(buf[offset : offset + 8]), "little")
    skeleton, metas = pickle.loads(_bytes(buf[offset + 8 : offset + 8 + length]))
    start = _aligned(offset + 8 + length)
    tensors = []
    for dtype, shape, off, nbytes in metas:
        raw = buf[start + off : start + off + nbytes]
        tensors.append(raw.view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype, device=buf.device))
    return _fill(skeleton, tensors)


class DispatchError(RuntimeError):
    """Process 0 of the data group failed while reading; raised on every other process too."""


_HEADER = 32  # kind, real, payload end, next capacity: four int64


class Dispatcher:
    """Sends (first process) or receives (others) one share of each step, in a single scatter.

    Every process keeps the same slot capacity; a slot starts with a 32-byte header
    ``[kind, real, end, capacity]`` followed by the encoded share (``end == 0``: no batch for this
    process at this step). A share larger than the capacity is preceded by a header-only ``GROW``
    scatter announcing the new capacity, so steady state is one collective per step.
    """

    def __init__(self, comm: Comm, capacity: int = 1 << 16) -> None:
        self.comm = comm
        self.capacity = capacity
        self._scratch: torch.Tensor | None = None

    def _slot(self, kind: int, real: int, end: int, capacity: int, payload: torch.Tensor | None = None) -> torch.Tensor:
        slot = payload if payload is not None and payload.numel() == self.capacity else None
        if slot is None:
            slot = torch.zeros(self.capacity, dtype=torch.uint8)
            if payload is not None:
                slot[_HEADER:end] = payload[_HEADER:end]
        slot[:_HEADER].view(torch.int64)[:] = torch.tensor([kind, real, end, capacity], dtype=torch.int64)
        return slot

    def _scatter(self, slots: list[torch.Tensor] | None) -> torch.Tensor:
        comm = self.comm
        if slots is None:
            out = torch.empty(self.capacity, dtype=torch.uint8, device=comm.device)
        else:
            if self._scratch is None or self._scratch.numel() != self.capacity:
                self._scratch = torch.empty(self.capacity, dtype=torch.uint8, device=comm.device)
            out = self._scratch  # process 0 keeps its own share: what it receives here is unused
            slots = [s.to(comm.device) for s in slots]
        comm.scatter(out, slots)
        return out

    def _post(self, kind: int, real: int, payloads: list[tuple[torch.Tensor, int] | None]) -> None:
        needed = max((end for p in payloads if p is not None for end in [p[1]]), default=_HEADER)
        if needed > self.capacity:
            grown = max(needed, 2 * self.capacity)
            self._scatter([self._slot(_GROW, -1, 0, grown) for _ in range(self.comm.size)])
            self.capacity = grown
        slots = [
            self._slot(kind, real, 0, self.capacity) if p is None else self._slot(kind, real, p[1], self.capacity, p[0])
            for p in payloads
        ]
        self._scatter(slots)

    def send(self, parts: list[Any | None], real: int) -> None:
        """First process: ``parts[r]`` goes to process ``r`` (``parts[0]`` stays here, unsent)."""
        payloads: list[tuple[torch.Tensor, int] | None] = [None]
        payloads += [None if p is None else encode(p, _HEADER, self.capacity) for p in parts[1:]]
        self._post(_DATA, real, payloads)

    def end(self) -> None:
        self._post(_END, -1, [None] * self.comm.size)

    def error(self, exc: BaseException) -> None:
        """Tells the others that reading failed (they raise ``DispatchError``)."""
        message = f"{type(exc).__name__}: {exc}"[:4000].encode()
        buf = torch.zeros(_HEADER + len(message), dtype=torch.uint8)
        buf[_HEADER:] = torch.frombuffer(bytearray(message), dtype=torch.uint8)
        self._post(_ERROR, -1, [(buf, buf.numel())] * self.comm.size)

    def receive(self) -> tuple[str, Any | None, int]:
        """Other processes: ``("data", share or None, real)``, ``("end", None, -1)``; raises on error."""
        while True:
            out = self._scatter(None)
            kind, real, end, capacity = out[:_HEADER].view(torch.int64).tolist()
            if kind != _GROW:
                break
            self.capacity = capacity
        if kind == _END:
            return "end", None, -1
        if kind == _ERROR:
            message = _bytes(out[_HEADER:end]).decode(errors="replace")
            raise DispatchError(f"Process 0 of the data group failed while reading the data: {message}")
        return "data", (decode(out[:end], _HEADER) if end else None), real
