"""Dispatch mode: the group's first process reads every batch and sends each process its share.

Wire format, chosen for speed (see ``bench/dataloader_overhead.py``): one ``uint8`` slot per
process and step, sent with a single collective. A slot holds a small header, then a pickled skeleton
of the batch (its structure and every non-tensor leaf, e.g. a list of strings) followed by the raw
bytes of its tensors, each aligned to 16 bytes. The receiver rebuilds tensors as views of the slot
without copying, so any shape and dtype goes through and shapes may change from batch to batch.
Pickling the tensors instead (``broadcast_object_list``) goes through ``torch.save`` for every
storage and costs two collectives per step; on CPU processes the collective's latency is most of
the cost, hence one per step. Encoding and decoding are plain memory copies and views, with as
few torch calls as possible (each costs microseconds).
"""

from __future__ import annotations

import ctypes
import io
import pickle
import struct
from typing import Any

import torch

from .comm import Comm

_ALIGN = 16
_DATA, _END, _ERROR, _RESIZE = 0, 1, 2, 3


_LENGTHS = struct.Struct("<2q")
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_NAMES = {d: name for name, d in _DTYPES.items()}


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Pickler(pickle.Pickler):
    """Pickles a batch with every tensor replaced by its index in ``tensors``.

    ``persistent_id`` finds tensors at any depth, inside custom objects too, without a tree walk
    of ours; the tensors' bytes go after the pickle, in the order they were met. The id is a bare
    int because the pickler calls ``persistent_id`` again on every part of a richer id.
    """

    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return None
        # Raw bytes need a contiguous CPU tensor; most batches already are one (no copy then).
        if not (obj.is_cpu and obj.is_contiguous()):
            obj = obj.detach().contiguous().cpu()
        self.tensors.append(obj)
        return len(self.tensors) - 1


class _Unpickler(pickle.Unpickler):
    """Rebuilds the tensors as views of the received buffer."""

    def __init__(
        self, file: io.BytesIO, buf: torch.Tensor, start: int, metas: list[tuple[str, tuple[int, ...], int]]
    ) -> None:
        super().__init__(file)
        self.buf, self.metas = buf, metas
        self.storage, self.base = buf.untyped_storage(), buf.storage_offset()
        self.offsets = []
        for _, _, nbytes in metas:
            self.offsets.append(start)
            start = _aligned(start + nbytes)

    def persistent_load(self, pid: Any) -> torch.Tensor:
        name, shape, nbytes = self.metas[pid]
        dtype = _DTYPES[name]
        if not nbytes:
            return torch.empty(shape, dtype=dtype, device=self.buf.device)
        t = torch.empty(0, dtype=dtype, device=self.buf.device)
        return t.set_(self.storage, (self.base + self.offsets[pid]) // t.element_size(), shape, _strides(shape))


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _Layout:
    """Where everything of one encoded object goes, computed before the buffer exists.

    Bytes: [16: lengths of the next two][pickled batch][pickled tensor metas]
    [tensor bytes, each aligned to 16].
    """

    __slots__ = ("end", "skeleton", "start", "tensors")

    def __init__(self, obj: Any, offset: int) -> None:
        self.tensors: list[torch.Tensor] = []
        file = io.BytesIO()
        _Pickler(file, self.tensors).dump(obj)
        batch = file.getvalue()
        metas = [(_NAMES[t.dtype], tuple(t.shape), t.nbytes) for t in self.tensors]
        described = pickle.dumps(metas, protocol=pickle.HIGHEST_PROTOCOL)
        self.skeleton = _LENGTHS.pack(len(batch), len(described)) + batch + described
        self.start = _aligned(offset + len(self.skeleton))
        data = 0
        for _, _, nbytes in metas:
            data = _aligned(data + nbytes)
        self.end = self.start + data

    def write(self, buf: torch.Tensor, offset: int) -> None:
        """Into a CPU ``uint8`` buffer at least ``self.end`` long (plain memory copies, no torch op)."""
        base = buf.data_ptr()
        ctypes.memmove(base + offset, self.skeleton, len(self.skeleton))
        position = self.start
        for t in self.tensors:
            nbytes = t.nbytes
            if nbytes:
                ctypes.memmove(base + position, t.data_ptr(), nbytes)
            position = _aligned(position + nbytes)


def encode(obj: Any, offset: int = 0, size_at_least: int = 0) -> tuple[torch.Tensor, int]:
    """``obj`` as one CPU ``uint8`` tensor, written from ``offset`` on (see the module docstring).

    The buffer is at least ``size_at_least`` long; returns it and the end of the encoded bytes.
    """
    layout = _Layout(obj, offset)
    buf = torch.empty(max(layout.end, size_at_least), dtype=torch.uint8)
    layout.write(buf, offset)
    return buf, layout.end


def _read(buf: torch.Tensor, offset: int, length: int) -> bytes:
    """``length`` bytes of a ``uint8`` tensor (without numpy, which torch does not require)."""
    if length <= 0:
        return b""
    if buf.device.type != "cpu":
        return _read(buf[offset : offset + length].cpu(), 0, length)
    return ctypes.string_at(buf.data_ptr() + offset, length)


def decode(buf: torch.Tensor, offset: int = 0) -> Any:
    """Inverse of ``encode``; tensors are views of ``buf`` (on ``buf``'s device), not copies."""
    batch, described = _LENGTHS.unpack(_read(buf, offset, _LENGTHS.size))
    head = _read(buf, offset + _LENGTHS.size, batch + described)
    metas = pickle.loads(head[batch:])
    start = _aligned(offset + _LENGTHS.size + batch + described)
    return _Unpickler(io.BytesIO(head[:batch]), buf, start, metas).load()


class DispatchError(RuntimeError):
    """Process 0 of the data group failed while reading; raised on every other process too."""


_HEADER = struct.Struct("<4q")  # kind, real, end of the encoded share (0: none), capacity: 32 bytes


def _round_up(n: int, multiple: int = 4096) -> int:
    return (n + multiple - 1) // multiple * multiple


class Dispatcher:
    """Sends (first process) or receives (others) one share of each step, in one collective.

    Every process keeps the same slot capacity; a slot starts with a 32-byte header
    ``[kind, real, end, capacity]`` followed by the encoded share. A share larger than the slot is
    preceded by a header-only ``RESIZE`` message announcing the new capacity (also sent to shrink
    the slot after many steps of much smaller shares), so the steady state is one collective per
    step: a broadcast with two processes (it moves the same bytes as a scatter and costs less in
    gloo), a scatter with more.
    """

    def __init__(self, comm: Comm, capacity: int = 4096) -> None:
        self.comm = comm
        self.capacity = capacity
        self._small_steps = 0
        self._scratch: list[torch.Tensor] = []

    # -- the collective ---------------------------------------------------------------------
    def _exchange(self, slots: list[torch.Tensor] | None) -> torch.Tensor | None:
        """Source: sends ``slots[r]`` to process ``r``. Others: returns the slot received."""
        comm = self.comm
        if slots is None:
            out = torch.empty(self.capacity, dtype=torch.uint8, device=comm.device)
            if comm.size == 2:
                comm.broadcast(out)
            else:
                comm.scatter(out, None)
            return out
        slots = [s if s.device == comm.device else s.to(comm.device) for s in slots]
        if comm.size == 2:
            comm.broadcast(slots[1])
            return None
        if len(self._scratch) != 2 or self._scratch[0].numel() != self.capacity:
            self._scratch = [torch.empty(self.capacity, dtype=torch.uint8, device=comm.device) for _ in range(2)]
        # The source keeps its own share: its slot and what it "receives" are scratch space.
        comm.scatter(self._scratch[0], [self._scratch[1], *slots[1:]])
        return None

    def _slot(self, kind: int, real: int, layout: _Layout | None, capacity: int | None = None) -> torch.Tensor:
        slot = torch.empty(self.capacity, dtype=torch.uint8)
        end = 0
        if layout is not None:
            layout.write(slot, _HEADER.size)
            end = layout.end
        ctypes.memmove(slot.data_ptr(), _HEADER.pack(kind, real, end, capacity or self.capacity), _HEADER.size)
        return slot

    def _post(self, kind: int, real: int, layouts: list[_Layout | None]) -> None:
        needed = max((layout.end for layout in layouts if layout is not None), default=_HEADER.size)
        self._small_steps = self._small_steps + 1 if needed < self.capacity // 4 else 0
        wanted = None
        if needed > self.capacity:
            wanted = _round_up(needed + needed // 4)
        elif self._small_steps >= 64 and self.capacity > 4096:
            wanted, self._small_steps = max(_round_up(needed + needed // 4), 4096), 0
        if wanted is not None:
            self._exchange([self._slot(_RESIZE, -1, None, wanted) for _ in range(self.comm.size)])
            self.capacity = wanted
        self._exchange([self._slot(kind, real, layout) for layout in layouts])

    # -- the two ends -----------------------------------------------------------------------
    def send(self, parts: list[Any | None], real: int) -> None:
        """First process: ``parts[r]`` goes to process ``r`` (``parts[0]`` stays here, unsent)."""
        self._post(_DATA, real, [None] + [None if p is None else _Layout(p, _HEADER.size) for p in parts[1:]])

    def end(self) -> None:
        self._post(_END, -1, [None] * self.comm.size)

    def error(self, exc: BaseException) -> None:
        """Tells the others that reading failed (they raise ``DispatchError``)."""
        message = f"{type(exc).__name__}: {exc}"[:4000]
        self._post(_ERROR, -1, [_Layout(message, _HEADER.size)] * self.comm.size)

    def receive(self) -> tuple[str, Any | None, int]:
        """Other processes: ``("data", share or None, real)``, ``("end", None, -1)``; raises on error."""
        while True:
            out = self._exchange(None)
            assert out is not None
            kind, real, end, capacity = _HEADER.unpack(_read(out, 0, _HEADER.size))
            if kind != _RESIZE:
                break
            self.capacity = capacity
        if kind == _END:
            return "end", None, -1
        if kind == _ERROR:
            raise DispatchError(
                f"Process 0 of the data group failed while reading the data: {decode(out, _HEADER.size)}"
            )
        return "data", (decode(out, _HEADER.size) if end else None), real
