"""How a stream of batches is shared between processes: the arithmetic, independent of torch.

The same rules apply to lists of indices (map-style datasets, sharded in the batch sampler before
any sample is read) and to collated batches (iterable datasets and the dispatcher). Consecutive
batches form *global steps* ("groups"): without ``split_batches`` a group is ``num_processes``
batches and process ``r`` takes the ``r``-th; with ``split_batches`` a group is one batch cut in
``num_processes`` equal slices. Concatenating the processes' batches of a step in process order
gives exactly what a single process would have read, in the same order.

The last group may be short. Then:

- ``drop_last`` (the loader's or its batch sampler's): the short group is dropped on every process.
- ``even_batches=True``: it is completed with samples from the start of the epoch so every process
  gets a batch of the usual size; the real samples come first in process order, so after a gather
  the first ``real`` items of the last step are the real ones (see ``Group.real``).
- ``even_batches=False``: nothing is added; trailing processes may get a smaller batch or none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

B = TypeVar("B")


class _End(Enum):
    END = 0  # an enum member, so `pending is not _END` narrows `pending` to a batch


_END = _End.END


@dataclass(frozen=True)
class ShardPlan:
    """How batches are shared.

    batch_size: size of one underlying batch when it is fixed (the global batch with
        ``split_batches``), ``None`` when batches vary (a custom batch sampler). Padding to a full
        batch needs it; without it a missing batch is replaced by a whole batch from the start.
    """

    num_processes: int
    split_batches: bool = False
    even_batches: bool = True
    drop_last: bool = False
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes}.")
        if self.split_batches and self.batch_size is not None and self.batch_size % self.num_processes:
            raise ValueError(
                f"split_batches=True needs the batch size ({self.batch_size}) to be a multiple of the number "
                f"of processes ({self.num_processes}): change the batch size, or use split_batches=False."
            )

    @property
    def pads(self) -> bool:
        """Whether a short last step is completed (a single process never needs to)."""
        return self.even_batches and self.num_processes > 1

    @property
    def batches_per_group(self) -> int:
        return 1 if self.split_batches else self.num_processes


@dataclass(frozen=True)
class BatchOps(Generic[B]):
    """Measuring, joining and cutting one kind of batch."""

    size: Callable[[B], int | None]
    concat: Callable[[Sequence[B]], B]
    cut: Callable[[B, int, int], B]


def _concat_lists(batches: Sequence[list[Any]]) -> list[Any]:
    out: list[Any] = []
    for b in batches:
        out.extend(b)
    return out


LIST_OPS: BatchOps[list[Any]] = BatchOps(size=len, concat=_concat_lists, cut=lambda b, s, e: list(b[s:e]))


@dataclass
class Group(Generic[B]):
    """One global step.

    parts: what each process gets, ``None`` for a process that gets nothing (``even_batches=False``).
    real: how many samples of the step are real (not padding), counted in process order: gathering
        the parts of the step in process order and keeping the first ``real`` items gives each real
        sample once. ``-1`` when the batches cannot be measured.
    final: whether this is the epoch's last step.
    """

    parts: list[B | None]
    real: int
    final: bool


class Head(Generic[B]):
    """The first batches of the epoch, kept to pad the last group (the "samples from the start")."""

    def __init__(self, ops: BatchOps[B], wanted_items: int | None, wanted_batches: int) -> None:
        self.ops = ops
        self.wanted_items = wanted_items
        self.wanted_batches = wanted_batches
        self.batches: list[B] = []
        self.items = 0
        self._flat: B | None = None

    def full(self) -> bool:
        if self.wanted_items is not None:
            return self.items >= self.wanted_items
        return len(self.batches) >= self.wanted_batches

    def add(self, batch: B) -> None:
        if not self.full():
            self.batches.append(batch)
            self.items += self.ops.size(batch) or 0

    def samples(self, count: int) -> B:
        """``count`` samples from the start of the epoch, cycling when the epoch is shorter."""
        if self._flat is None:
            self._flat = self.ops.concat(self.batches)
        available = self.ops.size(self._flat) or 0
        if available == 0:
            raise ValueError("accel-data cannot pad the last batch: the epoch has no samples to repeat.")
        pieces = []
        while count > 0:
            take = min(count, available)
            pieces.append(self.ops.cut(self._flat, 0, take))
            count -= take
        return pieces[0] if len(pieces) == 1 else self.ops.concat(pieces)

    def whole_batch(self, i: int) -> B:
        return self.batches[i % len(self.batches)]


def head_for(plan: ShardPlan, ops: BatchOps[B]) -> Head[B]:
    """An empty ``Head`` sized for ``plan``: enough samples to pad any last step."""
    wanted_items = plan.num_processes * plan.batch_size if plan.batch_size is not None else None
    return Head(ops, wanted_items, plan.num_processes)


def iter_groups(
    batches: Iterable[B],
    plan: ShardPlan,
    ops: BatchOps[B],
    skip: int = 0,
    head: Sequence[B] | None = None,
    keep: Head[B] | None = None,
    read_ahead: bool = True,
) -> Iterator[Group[B]]:
    """Groups ``batches`` into global steps following ``plan``.

    skip: steps to leave out at the start (resume); they are still read from ``batches``.
    head: the first batches of the epoch when ``batches`` already starts later (a resume that
        skipped at a lower level); used to pad the last group exactly as an uninterrupted epoch would.
    keep: the ``Head`` to collect them in, when the caller wants to save it (``head_for(plan, ops)``).
    read_ahead: read the batch after each step before handing the step out (so ``Group.final`` is
        always exact). With ``False`` a full step that would be the same as a last step is handed
        out first (its ``final`` is then False), and the next batch is read only when asked for:
        what a sampler draws can depend on how far it was read, and a loop may stop early.
    """
    if keep is None:
        keep = head_for(plan, ops)
    for b in head or ():
        keep.add(b)
    per_group = plan.batches_per_group
    it = iter(batches)
    buf: list[B] = []
    index = 0
    pending: B | _End = next(it, _END)
    while pending is not _END:
        keep.add(pending)
        buf.append(pending)
        if not read_ahead and len(buf) == per_group and _settled(buf, plan, ops):
            if index >= skip:
                group = make_group(buf, False, plan, ops, keep)
                if group is not None:
                    yield group
            index += 1
            buf = []
            pending = next(it, _END)
            continue
        # Look one batch ahead: only the epoch's last group may need padding or dropping.
        pending = next(it, _END)
        final = pending is _END
        if len(buf) < per_group and not final:
            continue
        if index >= skip:
            group = make_group(buf, final, plan, ops, keep)
            if group is not None:
                yield group
        index += 1
        buf = []


def _settled(buf: Sequence[B], plan: ShardPlan, ops: BatchOps[B]) -> bool:
    """Whether a full step comes out of ``make_group`` the same whether or not it is the epoch's last."""
    size, n = plan.batch_size, plan.num_processes
    if plan.split_batches:
        length = ops.size(buf[0])
        return length is not None and (length == size or (size is None and length % n == 0))
    if n == 1 or size is None or _sizes_total(buf, ops) < 0:
        return True
    return (ops.size(buf[-1]) or 0) >= size


def _sizes_total(buf: Sequence[B], ops: BatchOps[B]) -> int:
    total = 0
    for b in buf:
        size = ops.size(b)
        if size is None:
            return -1
        total += size
    return total


def make_group(buf: list[B], final: bool, plan: ShardPlan, ops: BatchOps[B], head: Head[B]) -> Group[B] | None:
    """The step made of ``buf`` (one batch with ``split_batches``, else up to ``num_processes``); ``None`` to drop
    it."""
    if plan.split_batches:
        return _split_group(buf[0], final, plan, ops, head)
    n, size = plan.num_processes, plan.batch_size
    real = _sizes_total(buf, ops)
    short_last = size is not None and real >= 0 and (ops.size(buf[-1]) or 0) < size
    complete = len(buf) == n and (not short_last or n == 1)
    if not final or complete:
        return Group(list(buf), real, final)
    if plan.drop_last:
        return None
    if not plan.pads:
        return Group(list(buf) + [None] * (n - len(buf)), real, final)
    if size is not None and real >= 0:
        missing = n * size - real
        if missing <= 0:
            return Group(list(buf) + [None] * (n - len(buf)), real, final)
        # Refill to n full batches: real samples first, then samples from the start of the epoch.
        flat = ops.concat([*buf, head.samples(missing)])
        return Group([ops.cut(flat, r * size, (r + 1) * size) for r in range(n)], real, final)
    # Variable batch sizes: processes without a batch get whole batches from the start.
    parts: list[B | None] = [*buf, *(head.whole_batch(i) for i in range(n - len(buf)))]
    return Group(parts, real, final)


def _split_group(batch: B, final: bool, plan: ShardPlan, ops: BatchOps[B], head: Head[B]) -> Group[B] | None:
    n, size = plan.num_processes, plan.batch_size
    length = ops.size(batch)
    if length is None:
        raise TypeError(
            "split_batches=True needs batches whose size can be read (tensors, lists, dicts of them); "
            "use split_batches=False for this data."
        )
    if not final or length == size or (size is None and length % n == 0):
        if length % n:
            raise ValueError(
                f"split_batches=True needs every batch's size to be a multiple of the number of processes "
                f"({n}), got a batch of {length}: change the batch size or use split_batches=False."
            )
        chunk = length // n
        return Group([ops.cut(batch, r * chunk, (r + 1) * chunk) for r in range(n)], length, final)
    # The last batch is short (or, of unknown size, does not divide evenly).
    if plan.drop_last and (size is None or length < size):
        return None
    if plan.pads:
        target = size if size is not None and length < size else length
        target = math.ceil(target / n) * n
        padded = ops.concat([batch, head.samples(target - length)]) if target > length else batch
        chunk = target // n
        return Group([ops.cut(padded, r * chunk, (r + 1) * chunk) for r in range(n)], length, final)
    # Unpadded: each process keeps its usual slice of the full batch's positions, so trailing
    # processes get a shorter slice or none (as Accelerate's BatchSamplerShard does).
    chunk = size // n if size is not None and length <= size else math.ceil(length / n)
    parts: list[B | None] = [
        ops.cut(batch, r * chunk, min((r + 1) * chunk, length)) if r * chunk < length else None for r in range(n)
    ]
    return Group(parts, length, final)


def batches_for_process(
    num_batches: int, plan: ShardPlan, process_index: int, last_batch_size: int | None = None
) -> int:
    """How many batches process ``process_index`` gets from ``num_batches`` underlying batches.

    last_batch_size: size of the last underlying batch when known (only matters for
    ``split_batches`` with ``even_batches=False``, where a tiny last batch leaves some processes out).
    """
    n = plan.num_processes
    if plan.split_batches:
        if not plan.even_batches and last_batch_size is not None and num_batches > 0:
            size = plan.batch_size
            chunk = size // n if size is not None and last_batch_size <= size else math.ceil(last_batch_size / n)
            if process_index * chunk >= last_batch_size:
                return num_batches - 1
        return num_batches
    full, extra = divmod(num_batches, n)
    if extra == 0 or plan.drop_last:
        return full
    if plan.even_batches:
        return full + 1
    return full + (1 if process_index < extra else 0)
