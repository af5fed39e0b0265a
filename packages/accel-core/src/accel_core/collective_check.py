"""The always-on agreement check that runs before a collective moves data.

A collective whose inputs differ across ranks does not fail cleanly in torch: ``all_gather`` of
different sizes returns a wrong-length result on one rank while gloo aborts the other, a dtype
mismatch returns reinterpreted bits, ``broadcast`` into a differently shaped tensor fills part of
it. So before ``gather`` / ``gather_for_metrics`` / ``broadcast`` / ``reduce`` /
``pad_across_processes`` move data, every rank describes its input (the nested structure, each
tensor's dtype and shape, or only the number of dimensions where the operation allows sizes to
differ) and all ranks exchange an 8-byte digest of that description in one ``all_gather``. Equal
digests: the data moves. Any difference: every rank sees it at the same time, exchanges the
readable descriptions (``all_gather_object``, only on this failure path) and raises the same
``DistributedOperationException`` naming each rank's shapes.

``gather`` and ``gather_for_metrics`` of tensors do better: the small tensors' data rides in the
same collective as the digest, in a buffer sized by what recent gathers on the group needed
(``checked_small_gather``), so an evaluation loop gathering ``(predictions, labels)`` pays one
collective per step as without the check, and large logits with their labels pay two, as without.

Cost (``bench/collective_check.py``): the digest of a structure seen before comes from a cache (no
strings built), the send and receive buffers of a gather seen before are reused with their header
already written (``_buffers``), and the exchange is one ``all_gather_into_tensor``: what remains is
a few torch operations per call, about as many as the unchecked gather's own packing.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Hashable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .state import PartialState


class DistributedOperationException(ValueError, RuntimeError):
    """Raised on every rank when the inputs of a collective do not match across processes.

    A ``ValueError`` (bad input) and, as before, a ``RuntimeError``.
    """


def contains_tensor(data: Any) -> bool:
    """Whether a nested structure (mappings, lists, tuples) holds a tensor anywhere."""
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, Mapping):
        return any(contains_tensor(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return any(contains_tensor(v) for v in data)
    return False


def describe(data: Any, ndim_only: bool = False, path: str = "") -> list[str]:
    """One line per leaf of ``data``: its path, then ``dtype shape`` for a tensor, or the object's type.

    A list or tuple holding no tensor is one object leaf (``gather_for_metrics`` gathers it as an
    object). ``ndim_only`` keeps only the number of dimensions (``pad_across_processes``).
    """
    if isinstance(data, torch.Tensor):
        if ndim_only:
            return [f"{path or 'tensor'}: {data.ndim}-d"]
        shape = tuple(data.shape)
        return [f"{path or 'tensor'}: {str(data.dtype).removeprefix('torch.')} {shape}"]
    if isinstance(data, Mapping):
        lines = [f"{path or 'input'}: {type(data).__name__} of {len(data)}"]
        for key, value in data.items():
            lines.extend(describe(value, ndim_only, f"{path}[{key!r}]"))
        return lines
    if isinstance(data, (list, tuple)) and contains_tensor(data):
        lines = [f"{path or 'input'}: {type(data).__name__} of {len(data)}"]
        for index, value in enumerate(data):
            lines.extend(describe(value, ndim_only, f"{path}[{index}]"))
        return lines
    return [f"{path or 'input'}: {type(data).__name__} (not a tensor)"]


def _digest(lines: list[str]) -> int:
    # A stable hash (Python's hash() of a str differs between processes), as a signed int64.
    raw = hashlib.blake2b("\n".join(lines).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def _structure(data: Any, leaves: list[torch.Tensor]) -> Hashable:
    """A hashable key that determines ``describe(data)`` (it may tell more apart), collecting the tensors.

    Cheaper than ``describe``: no strings are built, so an evaluation loop that gathers the same
    shapes at every step finds its digest in ``_DIGESTS``.
    """
    if isinstance(data, torch.Tensor):
        leaves.append(data)
        return (data.dtype, data.shape)
    if isinstance(data, Mapping):
        # The key's type too: 1 and True are equal keys but describe differently.
        return (type(data), tuple((type(k), k, _structure(v, leaves)) for k, v in data.items()))
    if isinstance(data, (list, tuple)):
        return (type(data), tuple(_structure(v, leaves) for v in data))
    return type(data)


_DIGESTS: dict[Hashable, int] = {}
_MAX_DIGESTS = 256  # distinct structures remembered (a last, shorter batch adds one per shape)


def _digest_of(data: Any, leaves: list[torch.Tensor], ndim_only: bool = False) -> int:
    """The digest of ``describe(data, ndim_only)``, from the cache when this structure was seen before."""
    key = (ndim_only, _structure(data, leaves))
    digest = _DIGESTS.get(key)
    if digest is None:
        if len(_DIGESTS) >= _MAX_DIGESTS:
            _DIGESTS.clear()
        digest = _DIGESTS[key] = _digest(describe(data, ndim_only=ndim_only))
    return digest


def _header(*values: int, device: torch.device) -> torch.Tensor:
    """int64 values as bytes on ``device`` (built from Python bytes: cheaper than torch.tensor, then a view)."""
    header = torch.frombuffer(bytearray(struct.pack(f"<{len(values)}q", *values)), dtype=torch.uint8)
    return header if device.type == "cpu" else header.to(device)


def check_agreement(operation: str, data: Any, group: Any = None, ndim_only: bool = False, hint: str = "") -> None:
    """Raises ``DistributedOperationException`` on every rank of ``group`` unless all pass alike inputs.

    One ``all_gather`` of one int64 per rank when they agree. ``ndim_only``: compare the structure,
    dtypes aside, and the number of dimensions only (the sizes may differ).
    hint: what to do about it, appended to the message.
    """
    mine = torch.tensor([_digest_of(data, [], ndim_only)], dtype=torch.int64, device=_check_device())
    everyone = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=mine.device)
    dist.all_gather_into_tensor(everyone, mine, group=group)
    values = everyone.tolist()
    if any(v != values[0] for v in values):
        raise_mismatch(operation, describe(data, ndim_only=ndim_only), group, ndim_only, hint)


def _check_device() -> torch.device:
    state = PartialState()
    return state.device if state.backend is not None and "nccl" in str(state.backend) else torch.device("cpu")


def raise_mismatch(operation: str, lines: list[str], group: Any, ndim_only: bool = False, hint: str = "") -> None:
    """Collective, once the ranks found their digests differ: exchanges the descriptions and raises on every rank."""
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, lines, group=group)
    described = "\n".join(f"  - process {i}: " + "; ".join(d) for i, d in enumerate(everyone))
    what = "structures or numbers of dimensions" if ndim_only else "structures, dtypes or shapes"
    raise DistributedOperationException(
        f"Cannot apply {operation}: the inputs have different {what} across processes (nothing was exchanged):\n"
        f"{described}\n{hint}".rstrip()
    )


SMALL_GATHER_BYTES = 16 * 2**10
"""The data a checked gather carries with its check at first (per rank); later calls adapt (``_Capacity``)."""

_HEADER = 3  # int64s: digest, which leaves ride along (a bit per leaf), the bytes the small leaves needed
_GRAIN = 2**10  # capacities are whole KiB
# Larger leaves go in their own collective: copying them in and out of the buffer would cost more
# than the second collective's latency.
_MAX_CAPACITY = 2**20
_MAX_CARRIED = 63  # leaves that may ride along: the bits of the int64 that lists them
_HISTORY = 8  # calls remembered per group


class _Capacity:
    """How many data bytes the next checked gather on one process group carries with its check.

    Every rank must send a buffer of the same size, so the size may only depend on what all ranks
    know alike: what the small leaves of the last few gathers on the group needed, read from the
    exchanged headers (identical on every rank). Leaves that do not fit go in their own collective
    after the check, and the capacity grows to fit such data next time (up to ``_MAX_CAPACITY``).
    """

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def current(self) -> int:
        if not self.sizes:
            return SMALL_GATHER_BYTES
        return max(_GRAIN, -(-max(self.sizes) // _GRAIN) * _GRAIN)

    def record(self, size: int) -> None:
        self.sizes = [*self.sizes[-(_HISTORY - 1) :], size]


_CAPACITIES: dict[int, _Capacity] = {}

_BUFFERS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_MAX_BUFFERS = 4  # an evaluation loop needs two (its batches and a shorter last one)


def _buffers(key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The send buffer (its header written) and receive buffer of a checked gather, kept for the next call alike.

    ``key``: (digest, carried, wanted, capacity, world size, device), which fix the header and the sizes.
    Reusing them saves an evaluation loop a few allocations and the header's packing at each step
    (a sizeable part of the check's own CPU cost): the collective is synchronous, and what is read
    back is copied out (``unpack``, ``tolist``) before the next call writes them.
    """
    found = _BUFFERS.pop(key, None)  # popped and put back: the dict's order is the use order
    if found is None:
        if len(_BUFFERS) >= _MAX_BUFFERS:
            del _BUFFERS[next(iter(_BUFFERS))]
        digest, carried, wanted, capacity, world, device = key
        send = torch.empty(_HEADER * 8 + capacity, dtype=torch.uint8, device=device)
        send[: _HEADER * 8] = _header(digest, carried, wanted, device=device)
        found = send, torch.empty(world * send.numel(), dtype=torch.uint8, device=device)
    _BUFFERS[key] = found
    return found


def unpack(rows: torch.Tensor, offset: int, leaf: torch.Tensor) -> torch.Tensor:
    """Every rank's ``leaf`` concatenated, from the bytes at ``offset`` of each row of ``rows`` (uint8, per rank)."""
    world = rows.shape[0]
    shape = (world * leaf.shape[0], *leaf.shape[1:]) if leaf.ndim else (world,)
    nbytes = leaf.numel() * leaf.element_size()
    if nbytes == 0:
        return leaf.new_empty(shape)  # a view(dtype) of no bytes is refused
    # A fresh tensor even for a group of one (where .contiguous() would keep an offset view(dtype) refuses).
    part = rows.narrow(1, offset, nbytes).clone(memory_format=torch.contiguous_format)
    return part.view(leaf.dtype).view(shape)


def checked_small_gather(
    operation: str, data: Any, group: Any = None, hint: str = ""
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The agreement check of a ``gather`` of tensors, with the small tensors' data in the same all_gather.

    Returns the leaves of ``data`` (in ``recursively_apply`` order) and, for each, its gathered
    tensor, or None for a leaf the caller must still gather (the check is done: it can move
    unchecked). Every rank sends the same fixed-size buffer — its digest, then the bytes of the
    leaves that fit in the group's current capacity (``_Capacity``: what recent gathers on the group
    needed) — so the exchange is safe whatever the ranks pass. A gather of a few hundred bytes is
    all latency: this makes the check free there; a loop gathering same-sized logits at every step
    pays one collective per step too; and large logits with small labels pay the labels' collective
    only, as without the check. When the digests differ: the same ``DistributedOperationException``
    as ``check_agreement``.
    """
    leaves: list[torch.Tensor] = []
    digest = _digest_of(data, leaves)
    device = leaves[0].device if leaves else _check_device()
    capacity_of = _CAPACITIES.setdefault(id(group) if group is not None else 0, _Capacity())
    capacity = capacity_of.current()
    # The same choice on every rank once the digests agree (equal shapes, equal capacity), devices aside:
    # the header says which leaves each rank carried, and the buffers are read only where all agree.
    carried = wanted = used = 0
    parts: list[torch.Tensor] = []
    for index, leaf in enumerate(leaves[:_MAX_CARRIED]):
        nbytes = leaf.numel() * leaf.element_size()
        if wanted + nbytes <= _MAX_CAPACITY:
            wanted += nbytes
        if used + nbytes <= capacity and leaf.device == device:
            carried |= 1 << index
            used += nbytes
            parts.append(leaf.contiguous().reshape(-1).view(torch.uint8))
    world = dist.get_world_size(group)
    buffer, everyone = _buffers((digest, carried, wanted, capacity, world, device))
    if parts:  # after the header; the rest of the buffer is never read back, so it need not be cleared
        torch.cat(parts, out=buffer.narrow(0, _HEADER * 8, used))
    dist.all_gather_into_tensor(everyone, buffer, group=group)
    rows = everyone.view(world, -1)
    # A row is the header and whole KiB: a multiple of 8 bytes, so it reads as int64s without a copy.
    headers = everyone.view(torch.int64).view(world, -1).narrow(1, 0, _HEADER).tolist()
    if any(h[0] != digest for h in headers):
        raise_mismatch(operation, describe(data), group, hint=hint)
    capacity_of.record(max(h[2] for h in headers))  # from the exchanged headers: the same on every rank
    if any(h[1] != carried for h in headers):
        carried = 0  # the ranks' buffers are laid out differently: every leaf goes its own way
    gathered: list[torch.Tensor | None] = []
    offset = _HEADER * 8
    for index, leaf in enumerate(leaves):
        if not carried >> index & 1:
            gathered.append(None)
            continue
        gathered.append(unpack(rows, offset, leaf))
        offset += leaf.numel() * leaf.element_size()
    return leaves, gathered
