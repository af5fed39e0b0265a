"""Samplers: the batch-sampler shard for map-style datasets and the seedable random sampler.

The shard wraps the user's own batch sampler (custom ones included), so sharding happens on lists
of indices before any sample is read: a resumed epoch skips batches without loading them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from itertools import chain, islice
from typing import Any, Protocol, TypeVar

import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SubsetRandomSampler, WeightedRandomSampler

from . import rng_states
from .rng_states import RawStates
from .sharding import LIST_OPS, Group, Head, ShardPlan, batches_for_process, iter_groups, make_group

_T = TypeVar("_T")
_NONE: Any = object()


class GroupSink(Protocol):
    """Told about every batch a shard hands out, in order (``rank``, parts in its step, real, final)."""

    def push(self, rank: int, parts: int, real: int, final: bool) -> None: ...


class LastGroup:
    """Sink keeping only the last entry: enough to know the final step's real samples once exhausted."""

    def __init__(self) -> None:
        self.real = -1
        self.final = False

    def push(self, rank: int, parts: int, real: int, final: bool) -> None:
        self.real, self.final = real, final


class NextIndices:
    """Whether the indices a shard handed out last are its pass's last (``last``), known by reading the next ones.

    Given to a shard (``BatchSamplerShard.next_indices``) by a loader without workers, which fetches each batch as
    its indices come: it knows the batch it yields is the epoch's last without reading the next batch, so no
    dataset read or random transform runs ahead of the step.
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = False


def with_last(it: Iterator[_T]) -> Iterator[tuple[_T, bool]]:
    """Each item of ``it`` with whether it is the last, known by reading the next item before handing it out."""
    following = next(it, _NONE)
    while following is not _NONE:
        current, following = following, next(it, _NONE)
        yield current, following is _NONE


def _indices_ahead(it: Iterator[_T], flag: NextIndices) -> Iterator[_T]:
    """``it``, one item read ahead: ``flag.last`` says whether the item just yielded was the last."""
    flag.last = False
    for current, last in with_last(it):
        flag.last = last
        yield current


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose order depends only on ``initial_seed + epoch`` (Accelerate's constructor).

    Every process (and every resumed run) with the same seed and epoch sees the same permutation,
    whatever happened to the random number generators in between. After a complete pass the epoch
    moves on by one, so iterating again gives the next epoch's order; ``set_epoch`` sets it.

    generator: reseeded at each pass (one is created when ``None``); the other arguments are
        ``RandomSampler``'s.
    data_seed: the seed; ``None`` takes ``torch.initial_seed()`` (the seed ``set_seed`` set).

    Example::

        sampler = SeedableRandomSampler(dataset, data_seed=42)
        sampler.set_epoch(3)
        order = list(sampler)  # the same on every process, every time
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        self.initial_seed = int(data_seed) if data_seed is not None else torch.initial_seed()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch whose order the next pass gives."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        if not self.replacement and self.num_samples == len(self.data_source):
            # RandomSampler's first permutation, as a list iterator: sharding reads every index,
            # and a generator costs more per index.
            order: Iterator[int] = iter(torch.randperm(self.num_samples, generator=self.generator).tolist())
        else:
            order = super().__iter__()
        return chain(order, self._next_epoch())

    def _next_epoch(self) -> Iterator[int]:
        """Empty; moves to the next epoch when a pass is complete (as Accelerate's sampler does)."""
        self.set_epoch(self.epoch + 1)
        yield from ()


class _SingletonBatches:
    """A sampler's indices as batches of one, so an un-batched loader shares the batch logic."""

    def __init__(self, sampler: Iterable[Any]) -> None:
        self.sampler = sampler
        self.batch_size = 1
        self.drop_last = False

    def __iter__(self) -> Iterator[list[Any]]:
        for index in self.sampler:
            yield [index]

    def __len__(self) -> int:
        return len(self.sampler)  # pyright: ignore[reportArgumentType]  # torch's samplers are sized


class UnbatchedShard(Sampler[Any]):
    """Sampler of single indices over a ``BatchSamplerShard`` of singletons (loaders with ``batch_size=None``)."""

    def __init__(self, shard: BatchSamplerShard) -> None:
        self.shard = shard

    def __iter__(self) -> Iterator[Any]:
        for batch in self.shard:
            yield batch[0]

    def __len__(self) -> int:
        return len(self.shard)


class BatchSamplerShard(BatchSampler):
    """This process's batches of indices from ``batch_sampler``, following the rules of ``accel_data.sharding``.

    process_index: the process whose batches to yield; ``None`` yields every process's batch of
        each step in process order (what the dispatching process loads).
    even_batches: may be changed between epochs (``Accelerator.join_uneven_inputs`` does).
    skip: steps to leave out at the start of the next iterations (set by the prepared loader).
    next_indices: when set, the iteration reads one batch of indices ahead and says there whether the last one
        handed out ends the pass (set by the prepared loader without workers, see ``NextIndices``).
    track_draw: keep the RNG states each pass's first read drew from (``drawn_from``), and replay a
        pass from ``replay_from`` when set (see ``_started``). Set by the prepared loader when the
        sampler has no generator of its own, so its order comes from the global RNGs as in PyTorch.

    Example::

        shard = BatchSamplerShard(BatchSampler(range(10), 3, False), num_processes=2, process_index=1)
        list(shard)  # [[3, 4, 5], [9, 0, 1]]  (the last batch completed from the start)
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[Any]],
        num_processes: int = 1,
        process_index: int | None = 0,
        split_batches: bool = False,
        even_batches: bool = True,
        drop_last: bool | None = None,
    ) -> None:
        # BatchSampler.__init__ validates a sampler + batch_size we do not have: set fields directly.
        self.batch_sampler = batch_sampler
        self.sampler = getattr(batch_sampler, "sampler", None)
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.drop_last = bool(getattr(batch_sampler, "drop_last", False) if drop_last is None else drop_last)
        size = getattr(batch_sampler, "batch_size", None)
        self.total_batch_size = size if isinstance(size, int) else None
        if self.total_batch_size is not None and not split_batches:
            self.total_batch_size *= num_processes
        per_process = size if isinstance(size, int) else None
        if per_process is not None and split_batches:
            per_process //= num_processes
        self.batch_size = per_process
        self.skip = 0
        self.sink: GroupSink | None = None
        self.next_indices: NextIndices | None = None
        self.track_draw = False
        self.draw_sampler: Any = None  # the sampler that draws, given a generator if a resume needs one
        self.drawn_from: RawStates | None = None
        self.replay_from: RawStates | None = None
        self.plan()  # validate now, not at the first iteration

    def _started(self, it: Iterator[_T]) -> Iterator[_T]:
        """``it`` with its first item read now: where a sampler without a generator draws its order.

        torch's ``RandomSampler`` draws its pass's seed from the global RNG at its first item
        (``SubsetRandomSampler`` and ``WeightedRandomSampler`` their whole draw), after the
        DataLoader's base seed and after whatever the script drew since the last pass, exactly as in
        plain PyTorch. The states read from are kept (``drawn_from``) for the loader's state; a
        resumed pass reads its first item from the saved states (``replay_from``) and puts back
        the restored ones, so it gets the interrupted order and leaves the checkpoint's RNGs as
        they were. Called inside the iteration, never at ``iter()``: torch opens the batch
        sampler before drawing the base seed.
        """
        if not self.track_draw:
            return it
        replay, self.replay_from = self.replay_from, None
        if replay is None:
            self.drawn_from = rng_states.capture()
            first = list(islice(it, 1))
        else:
            current = rng_states.capture()
            rng_states.restore(replay)
            try:
                first = list(islice(it, 1))
            finally:
                rng_states.restore(current)
            self.drawn_from = replay
        return chain(first, it)

    def plan(self) -> ShardPlan:
        size = getattr(self.batch_sampler, "batch_size", None)
        return ShardPlan(
            num_processes=self.num_processes,
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            drop_last=self.drop_last,
            batch_size=size if isinstance(size, int) else None,
        )

    def set_epoch(self, epoch: int) -> None:
        for target in (self.batch_sampler, self.sampler):
            set_epoch = getattr(target, "set_epoch", None)
            if set_epoch is not None:
                set_epoch(epoch)

    def _groups(self, plan: ShardPlan, skip: int) -> Iterator[Group[list[Any]]]:
        if type(self.batch_sampler) is BatchSampler:
            return self._index_groups(self.batch_sampler, plan, skip, self._started)
        # Read no further than the step handed out, as Accelerate's shard reads a batch sampler.
        batches = self._started(iter(self.batch_sampler))
        return iter_groups(batches, plan, LIST_OPS, skip=skip, read_ahead=False)

    @staticmethod
    def _index_groups(
        bs: BatchSampler, plan: ShardPlan, skip: int, started: Callable[[Iterator[Any]], Iterator[Any]]
    ) -> Iterator[Group[list[Any]]]:
        """Fast path for torch's own BatchSampler: cut the sampler's index stream step by step.

        Same groups as ``iter_groups`` over the batch sampler, but a step is one ``islice`` of the
        indices instead of ``num_processes`` Python-built batches, and skipping a resumed epoch's
        first steps is one ``islice`` too.
        """
        size, n = bs.batch_size, plan.num_processes
        chunk = plan.batches_per_group * size
        part = size // n if plan.split_batches else size
        indices = started(iter(bs.sampler))
        # The start of the epoch, kept to pad the last step, whatever is skipped.
        first = list(islice(indices, n * size))
        keep: Head[list[Any]] = Head(LIST_OPS, n * size, n)
        keep.add(first)
        skipped = skip * chunk
        rest = chain(first[skipped:], indices) if skipped <= len(first) else islice(indices, skipped - len(first), None)
        current = list(islice(rest, chunk))
        while current:
            following = list(islice(rest, chunk))
            if len(current) == chunk:
                yield Group([current[r * part : (r + 1) * part] for r in range(n)], chunk, not following)
            else:
                batches = [current[i : i + size] for i in range(0, len(current), size)]
                if bs.drop_last and len(batches[-1]) < size:
                    batches.pop()
                group = make_group(batches, True, plan, LIST_OPS, keep) if batches else None
                if group is not None:
                    yield group
            current = following

    @staticmethod
    def _own_index_batches(
        bs: BatchSampler,
        plan: ShardPlan,
        skip: int,
        rank: int,
        sink: GroupSink | None,
        started: Callable[[Iterator[Any]], Iterator[Any]],
    ) -> Iterator[list[Any]]:
        """``_index_groups`` for one process, with the full steps (all but the last) cut in place.

        Indices are read from the sampler step by step, never further than the step being handed
        out, as Accelerate's shard reads its batch sampler: what a sampler draws depends on how far
        it was read (torch's ``RandomSampler`` draws a second permutation once exhausted), so a loop
        left early (an early stop) must leave the generator where Accelerate's would, or the next
        epoch's shuffle differs.
        """
        size, n = bs.batch_size, plan.num_processes
        chunk = plan.batches_per_group * size
        part = size // n if plan.split_batches else size
        lo, hi = rank * part, (rank + 1) * part
        indices = started(iter(bs.sampler))
        # The start of the epoch, kept to pad the last step, whatever is skipped.
        keep: Head[list[Any]] = Head(LIST_OPS, n * size, n)
        skipped = skip * chunk
        if skipped:
            first = list(islice(indices, min(skipped, n * size)))
            keep.add(first)
            if skipped > len(first):
                deque(islice(indices, skipped - len(first)), maxlen=0)  # read and dropped in C
        real = -1
        while len(current := list(islice(indices, chunk))) == chunk:
            keep.add(current)
            real = chunk
            yield current[lo:hi]
        if current:
            keep.add(current)
            batches = [current[i : i + size] for i in range(0, len(current), size)]
            if bs.drop_last and len(batches[-1]) < size:
                batches.pop()
            group = make_group(batches, True, plan, LIST_OPS, keep) if batches else None
            part = group.parts[rank] if group is not None else None
            if group is not None and part is not None:
                real = group.real
                yield part
        if sink is not None and real >= 0:
            sink.push(rank, 1, real, True)

    def __iter__(self) -> Iterator[list[Any]]:
        plan, rank = self.plan(), self.process_index
        if rank is not None and type(self.batch_sampler) is BatchSampler:
            it = self._own_index_batches(self.batch_sampler, plan, self.skip, rank, self.sink, self._started)
        else:
            it = self._parts(plan, self.skip, self.sink, rank)
        return it if self.next_indices is None else _indices_ahead(it, self.next_indices)

    def _parts(self, plan: ShardPlan, skip: int, sink: GroupSink | None, rank: int | None) -> Iterator[list[Any]]:
        for group in self._groups(plan, skip):
            if rank is not None:
                part = group.parts[rank]
                if part is not None:
                    if sink is not None:
                        sink.push(rank, 1, group.real, group.final)
                    yield part
                continue
            present = [(r, p) for r, p in enumerate(group.parts) if p is not None]
            for r, part in present:
                if sink is not None:
                    sink.push(r, len(present), group.real, group.final)
                yield part

    def __len__(self) -> int:
        plan = self.plan()
        total = len(self.batch_sampler)  # pyright: ignore[reportArgumentType]  # torch's batch samplers are sized
        last = _last_batch_size(self.batch_sampler)
        if self.process_index is not None:
            return max(batches_for_process(total, plan, self.process_index, last) - self.skip, 0)
        return sum(max(batches_for_process(total, plan, r, last) - self.skip, 0) for r in range(plan.num_processes))


def _last_batch_size(batch_sampler: Any) -> int | None:
    size = getattr(batch_sampler, "batch_size", None)
    sampler = getattr(batch_sampler, "sampler", None)
    if not isinstance(size, int) or sampler is None:
        return None
    try:
        count = len(sampler)
    except TypeError:
        return None
    if getattr(batch_sampler, "drop_last", False):
        return size
    return count % size or size


_GENERATOR_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def ensure_generator(sampler: Any, create: bool = True) -> torch.Generator | None:
    """The sampler's ``torch.Generator``; with ``create``, torch's random samplers get one when they have none.

    Used when several processes shard one sampler (as Accelerate does then): without their own
    generator these samplers draw from the global RNG, which differs between processes; with one,
    its state is synchronised from process 0 at each epoch and saved for resume. Its seed comes
    from the global RNG, as the sampler would have drawn it. A sampler read by one process keeps
    drawing from the global RNG at each pass, as in PyTorch (``create=False``).
    """
    generator = getattr(sampler, "generator", None)
    if create and generator is None and isinstance(sampler, _GENERATOR_SAMPLERS):
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        sampler.generator = generator
    return generator if isinstance(generator, torch.Generator) else None


def seedable_copy(sampler: RandomSampler, seed: int) -> SeedableRandomSampler:
    """The same draw as ``sampler`` (replacement, num_samples, its generator) made from ``seed + epoch``."""
    return SeedableRandomSampler(
        sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        generator=sampler.generator,
        data_seed=seed,
    )
