"""The always-on agreement check that runs before a collective moves data.

A collective whose inputs differ across ranks does not fail cleanly in torch: ``all_gather`` of
different sizes returns a wrong-length result on one rank while gloo aborts the other, a dtype
mismatch returns reinterpreted bits, ``broadcast`` into a differently shaped tensor fills part of
it. So before ``gather`` / ``gather_for_metrics`` / ``broadcast`` / ``reduce`` /
``pad_across_processes`` move data, every rank describes its input (the nested structure, each
tensor's dtype and shape, or only the number of dimensions where the operation allows sizes to
differ) and all ranks exchange an 8-byte digest of that description in one ``all_gather`` of a
single int64. Equal digests: the data moves. Any difference: every rank sees it at the same time,
exchanges the readable descriptions (``all_gather_object``, only on this failure path) and raises
the same ``DistributedOperationException`` naming each rank's shapes.

``gather`` and ``gather_for_metrics`` of tensors do better: the data rides in the same collective
as its digest when it fits the group's current capacity, which follows the sizes recent gathers
needed (``checked_small_gather``), so an evaluation loop pays one collective per gather, as
without the check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from .state import PartialState


class DistributedOperationException(ValueError, RuntimeError):
    """Raised on every rank when the inputs of a collective do not match across processes.

    A ``ValueError`` (bad input) and, as before, a ``RuntimeError``.
    """


def _contains_tensor(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, Mapping):
        return any(_contains_tensor(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return any(_contains_tensor(v) for v in data)
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
    if isinstance(data, (list, tuple)) and _contains_tensor(data):
        lines = [f"{path or 'input'}: {type(data).__name__} of {len(data)}"]
        for index, value in enumerate(data):
            lines.extend(describe(value, ndim_only, f"{path}[{index}]"))
        return lines
    return [f"{path or 'input'}: {type(data).__name__} (not a tensor)"]


def _digest(lines: list[str]) -> int:
    # A stable hash (Python's hash() of a str differs between processes), as a signed int64.
    raw = hashlib.blake2b("\n".join(lines).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def check_agreement(operation: str, data: Any, group: Any = None, ndim_only: bool = False, hint: str = "") -> None:
    """Raises ``DistributedOperationException`` on every rank of ``group`` unless all pass alike inputs.

    One ``all_gather`` of one int64 per rank when they agree. ``ndim_only``: compare the structure,
    dtypes aside, and the number of dimensions only (the sizes may differ).
    hint: what to do about it, appended to the message.
    """
    lines = describe(data, ndim_only=ndim_only)
    mine = torch.tensor([_digest(lines)], dtype=torch.int64, device=_check_device())
    world = dist.get_world_size(group)
    digests = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(digests, mine, group=group)
    values = [int(d.item()) for d in digests]
    if any(v != values[0] for v in values):
        raise_mismatch(operation, lines, group, ndim_only, hint)


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

_HEADER = 3  # int64s: digest, whether the data fit, its size in bytes
_GRAIN = 2**10  # capacities are whole KiB
_MAX_CAPACITY = 2**20  # beyond this a second collective's latency is small next to moving the data
_HISTORY = 8  # calls remembered per group


class _Capacity:
    """How many data bytes the next checked gather on one process group carries with its check.

    Every rank must send a buffer of the same size, so the size may only depend on what all ranks
    know alike: the sizes of the last few gathers on the group, read from the exchanged headers
    (identical on every rank). A gather whose data fits travels in one collective; one that does
    not costs a second collective, after which the capacity grows to fit such data (up to
    ``_MAX_CAPACITY``; larger data keeps the check small).
    """

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def current(self) -> int:
        if not self.sizes:
            return SMALL_GATHER_BYTES
        largest = max(self.sizes)
        if largest > _MAX_CAPACITY:
            return _GRAIN
        return max(_GRAIN, -(-largest // _GRAIN) * _GRAIN)

    def record(self, size: int) -> None:
        self.sizes = [*self.sizes[-(_HISTORY - 1) :], size]


_CAPACITIES: dict[int, _Capacity] = {}


def checked_small_gather(operation: str, data: Any, group: Any = None, hint: str = "") -> Any | None:
    """``gather`` of tensors and its agreement check in one all_gather when the data fits; None when it does not.

    Every rank sends the same fixed-size buffer — its digest, then its tensors' bytes when they fit
    in the group's current capacity (``_Capacity``: what recent gathers on the group needed) — so the
    exchange is safe whatever the ranks pass. A gather of a few hundred bytes is all latency: this
    makes the check free there, and a loop gathering same-sized logits at every step pays one
    collective per step too. When the digests agree and every rank's data fit, the result is
    unpacked from the buffers; when they agree but the data is larger, None tells the caller to move
    it (the check is done). When they differ: the same ``DistributedOperationException`` as
    ``check_agreement``.
    """
    lines = describe(data)
    leaves: list[torch.Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            leaves.append(value[None] if value.ndim == 0 else value)
        elif isinstance(value, Mapping):
            for item in value.values():
                collect(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    collect(data)
    device = leaves[0].device if leaves else _check_device()
    size = sum(t.numel() * t.element_size() for t in leaves)
    capacity_of = _CAPACITIES.setdefault(id(group) if group is not None else 0, _Capacity())
    capacity = capacity_of.current()
    fits = size <= capacity and all(t.device == device for t in leaves)
    header = torch.tensor([_digest(lines), int(fits), size], dtype=torch.int64)
    # Only the header and the data are read back: the rest of the buffer need not be cleared.
    buffer = torch.empty(_HEADER * 8 + capacity, dtype=torch.uint8, device=device)
    buffer[: _HEADER * 8] = header.view(torch.uint8).to(device)
    if fits and leaves:
        buffer[_HEADER * 8 : _HEADER * 8 + size] = torch.cat(
            [t.contiguous().reshape(-1).view(torch.uint8) for t in leaves]
        )
    world = dist.get_world_size(group)
    everyone = torch.empty(world * buffer.numel(), dtype=torch.uint8, device=device)
    dist.all_gather(list(everyone.view(world, -1).unbind(0)), buffer, group=group)
    rows = everyone.view(world, -1)
    headers = rows[:, : _HEADER * 8].contiguous().view(torch.int64).cpu().tolist()
    if any(h[0] != headers[0][0] for h in headers):
        raise_mismatch(operation, lines, group, hint=hint)
    capacity_of.record(max(h[2] for h in headers))  # from the exchanged headers: the same on every rank
    if not all(h[1] for h in headers):
        return None
    gathered, offset = [], _HEADER * 8
    for t in leaves:
        nbytes = t.numel() * t.element_size()
        part = rows[:, offset : offset + nbytes].contiguous().view(t.dtype)
        gathered.append(part.reshape(world * t.shape[0], *t.shape[1:]))
        offset += nbytes
    results = iter(gathered)

    def rebuild(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return next(results)
        if isinstance(value, Mapping):
            # A Mapping subclass built from a dict (dict, OrderedDict, BatchEncoding).
            return type(value)({k: rebuild(v) for k, v in value.items()})  # pyright: ignore[reportCallIssue]
        if isinstance(value, (list, tuple)):
            items = [rebuild(v) for v in value]
            # A namedtuple takes its fields as arguments; list and tuple take one iterable.
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        raise TypeError(
            f"Unsupported type {type(value).__name__} passed to {operation}: only nested lists, tuples and dicts of "
            "torch.Tensor are supported. Use gather_object for other Python objects."
        )

    return rebuild(data)
