"""The prepared dataloader: a ``DataLoader`` that yields this process's share of every step.

It is the user's DataLoader rebuilt with the same dataset, collate_fn, workers, pin_memory and
generator, whose batch sampler is wrapped by a ``BatchSamplerShard`` (map-style datasets); an
iterable dataset's batches are shared after loading (every process reads the stream and keeps
its batches), or read by process 0 alone and sent out (dispatch mode). On top it places batches
on the device, synchronises RNGs per epoch, reports the end of the data to ``GradientState``,
and saves / restores its position.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from ._tree import to_device
from .comm import Comm
from .dispatch import Dispatcher
from .resume import ResumableMixin, _Progress
from .rng import synchronize_rng_states
from .samplers import BatchSamplerShard, LastGroup, NextIndices, SeedableRandomSampler, _last_batch_size, with_last
from .sharding import BatchOps, ShardPlan, batches_for_process, head_for, iter_groups

if TYPE_CHECKING:
    from accel_core.protocols import BatchBoundaryHook

_END = object()


def _tree_ops() -> BatchOps[Any]:
    from ._tree import batch_size, concat_batches, slice_batch

    return BatchOps(size=batch_size, concat=concat_batches, cut=slice_batch)


TREE_OPS = _tree_ops()


class _WithState:
    """A batch and the StatefulDataLoader state right after its step."""

    __slots__ = ("batch", "state")

    def __init__(self, batch: Any, state: dict[str, Any] | None) -> None:
        self.batch, self.state = batch, state


class _Meta:
    """Sink of a dispatching shard: which process each loaded batch is for, in loading order."""

    def __init__(self) -> None:
        self.entries: deque[tuple[int, int, int, bool]] = deque()

    def push(self, rank: int, parts: int, real: int, final: bool) -> None:
        self.entries.append((rank, parts, real, final))


class _Snapshots:
    """Iterator over a StatefulDataLoader recording its state before each pull.

    When a group is formed, the last pull was the look-ahead batch after it, so ``before_last``
    is the state right after the group: the point a resume must restart from.
    """

    def __init__(self, it: Iterator[Any], loader: ShardedLoaderMixin) -> None:
        self.it = it
        self.loader = loader
        self.before_last: dict[str, Any] | None = None

    def __iter__(self) -> _Snapshots:
        return self

    def __next__(self) -> Any:
        self.before_last = self.loader._inner_state_dict()
        return next(self.it)


class ShardedLoaderMixin(ResumableMixin):
    """What the prepared loaders add to ``DataLoader`` / torchdata's ``StatefulDataLoader``.

    Attributes read by accel-core's ``GradientState`` while iterating:

    end_of_dataloader: True while the last batch of the epoch is being yielded (one batch is read
        ahead to know it; without workers, only the next batch's indices).
    remainder: while ``end_of_dataloader`` is True, how many samples of the last global step are
        real. The last step's batches gathered in process order hold the real samples first, so
        ``gather(batch)[:remainder]`` is exactly the data without the padding that
        ``even_batches`` added (``gather_for_metrics`` does this when ``remainder > 0``). It equals
        the whole step when nothing was padded. -1 before the end, or when batches cannot be
        measured (a custom batch type).

    batch_boundary_hook: called with the loader at each request for a batch (the first included) and
        once after the epoch ended (``accel_core.protocols.BatchBoundaryHook``): the Accelerator that
        prepared the loader takes its periodic checkpoints there. None when prepared without one.
    """

    end_of_dataloader: bool = False
    remainder: int = -1
    batch_boundary_hook: BatchBoundaryHook | None = None

    def _accel_setup(
        self,
        *,
        base: DataLoader,
        kind: str,
        shard: BatchSamplerShard | None,
        plan: ShardPlan | None,
        num_processes: int,
        process_index: int,
        split_batches: bool,
        dispatch: bool,
        device: torch.device | None,
        put_on_device: bool,
        non_blocking: bool,
        rng_types: list[str],
        comm: Comm | None,
        generator: torch.Generator | None,
        seedable: SeedableRandomSampler | None,
        stateful: bool,
        rng_comm: Comm | None = None,
        boundary_hook: BatchBoundaryHook | None = None,
        sync_draw: bool = False,
        private_rng: bool = False,
    ) -> None:
        self.base_dataloader = base
        self.batch_boundary_hook = boundary_hook
        self._kind = kind
        self._shard = shard
        self._plan = plan
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.dispatch_batches = dispatch
        self.device = device
        # Batches come out of a DataLoader on the CPU: on a CPU run there is nothing to move.
        self._place = bool(put_on_device and device is not None and device.type != "cpu")
        self.non_blocking = non_blocking
        self.rng_types = rng_types
        self._comm = comm
        self._rng_comm = rng_comm if rng_comm is not None else comm  # who shares one permutation
        self._dispatcher = Dispatcher(comm) if dispatch and comm is not None else None
        self._generator = generator
        # The sampler draws from the global RNG and several processes read all of it (tensor-parallel
        # peers): the torch RNG is synchronised at the start of each epoch, so they draw alike.
        self._sync_draw = sync_draw
        self._seedable = seedable
        # The generator (or seedable sampler's seed) is the loader's own: nothing but its sampler draws from it,
        # once per pass on every process, so once synchronised the processes stay alike and later epochs need no
        # broadcast. A per-epoch broadcast waits for the slowest process at every epoch's start (its cost in
        # bench/compare: 0.06 ms per batch of 128 per epoch, 2 processes); a loaded state synchronises again.
        self._private_rng = private_rng
        self._rng_synced = False
        self._stateful = stateful
        self._skip = 0
        self._progress = _Progress()
        self.end_of_dataloader = False
        self.remainder = -1

    # -- the plan ---------------------------------------------------------------------------
    def _current_plan(self) -> ShardPlan:
        if self._shard is not None:
            return self._shard.plan()
        assert self._plan is not None
        return self._plan

    @property
    def even_batches(self) -> bool:
        return self._current_plan().even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        # Accelerator.join_uneven_inputs switches it for the duration of a block.
        if self._shard is not None:
            self._shard.even_batches = bool(value)
        else:
            assert self._plan is not None
            self._plan = dataclasses.replace(self._plan, even_batches=bool(value))

    @property
    def total_batch_size(self) -> int | None:
        """Samples per global step (all processes), ``None`` when batches vary in size."""
        size = self._current_plan().batch_size
        if size is None:
            return None
        return size if self.split_batches else size * self.num_processes

    @property
    def total_dataset_length(self) -> int:
        return len(self.dataset)  # pyright: ignore[reportArgumentType]  # a stream: TypeError

    @property
    def epoch(self) -> int:
        return self._progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch and forwards it to the sampler, batch sampler and dataset that have ``set_epoch``."""
        self._progress.epoch = int(epoch)
        targets = [self._shard.batch_sampler, self._shard.sampler] if self._shard is not None else []
        targets.append(self.dataset)
        for target in targets:
            if hasattr(target, "set_epoch") and not isinstance(target, SeedableRandomSampler):
                target.set_epoch(epoch)

    # -- iteration --------------------------------------------------------------------------
    def _base_iter(self) -> Iterator[Any]:
        # torch draws each new iterator's base seed (the workers' seeds) from `self.generator`, else
        # from the global RNG, as Accelerate's loader does. A resumed run opens its iterator
        # mid-epoch, after the global RNG was restored to the checkpoint's point: drawing from it
        # again would shift the user's dropout stream, so a resumed epoch draws from the state the
        # interrupted epoch drew from (saved in `state_dict`), and the global RNG is left alone.
        p = self._progress
        restore, p.resume_seed_state = p.resume_seed_state, None
        source: torch.Generator | None = self.generator
        if restore is None:
            p.seed_state = source.get_state() if source is not None else torch.get_rng_state()
            return super().__iter__()  # pyright: ignore[reportAttributeAccessIssue]  # the DataLoader after this mixin
        if source is not None:
            source.set_state(restore)
            return super().__iter__()  # pyright: ignore[reportAttributeAccessIssue]  # the DataLoader after this mixin
        replay = torch.Generator()
        replay.set_state(restore)
        self.generator = replay
        try:
            return super().__iter__()  # pyright: ignore[reportAttributeAccessIssue]  # the DataLoader after this mixin
        finally:
            self.generator = None

    def _inner_state_dict(self) -> dict[str, Any]:
        # The DataLoader class after the mixins (StatefulDataLoader), not ResumableMixin's own.
        return super(ResumableMixin, self).state_dict()  # pyright: ignore[reportAttributeAccessIssue]  # the DataLoader after the mixins

    def _begin(self) -> tuple[int, dict[str, Any] | None]:
        p = self._progress
        seed = self._seedable.initial_seed if self._seedable is not None else None
        kinds = self.rng_types
        replaying = self._shard is not None and self._shard.replay_from is not None
        if self._sync_draw and not replaying and "torch" not in kinds:
            kinds = [*kinds, "torch"]
        if not (self._rng_synced and self._private_rng and kinds == ["generator"]):
            seed = synchronize_rng_states(kinds, self._rng_comm, self._generator, seed)
            self._rng_synced = True
        if self._seedable is not None and seed is not None:
            self._seedable.initial_seed = seed
            self._seedable.set_epoch(p.epoch)
        resume_inner, p.resume_inner = p.resume_inner, None
        skip = self._skip + p.resume_skip
        p.position = skip
        if resume_inner is not None:
            # torchdata restores the position itself: only the persistent skip was already applied.
            skip = 0
            super(ResumableMixin, self).load_state_dict(resume_inner)  # pyright: ignore[reportAttributeAccessIssue]  # the DataLoader after the mixins
        p.resume_skip = 0
        p.in_epoch, p.epoch_done = True, False
        p.inner_state = resume_inner
        p.generator_state = self._generator.get_state() if self._generator is not None else None
        return skip, resume_inner

    def _source(self, skip: int, tail: Any) -> Iterator[Any]:
        """This process's batches of the epoch; ``tail.real`` is final once it is exhausted.

        Items are batches, or ``_WithState`` pairs when a StatefulDataLoader's state must travel
        with each batch through the look-ahead.
        """
        if self._dispatcher is not None and not self._dispatcher.comm.is_source:
            return self._receive(tail)
        if self._dispatcher is not None:
            return self._dispatch_map(skip, tail) if self._shard is not None else self._dispatch_stream(skip, tail)
        if self._shard is not None:
            # Worker processes draw their random transforms from their own RNG, seeded once per
            # epoch: skipped batches they never loaded would leave each worker's stream where the
            # epoch began, so a resumed epoch would augment its remaining batches differently.
            # With workers, the skipped batches are loaded (in the workers) and dropped here.
            replay = skip if self.num_workers > 0 else 0  # pyright: ignore[reportAttributeAccessIssue]  # a DataLoader mixin: its num_workers
            self._shard.skip, self._shard.sink = skip - replay, tail
            # Straight from the DataLoader: no generator of ours in between on the hot path.
            it = self._base_iter()
            for _ in range(replay):
                if next(it, _END) is _END:
                    break
            return it
        return self._stream(skip, tail)

    def _groups(self, skip: int) -> tuple[Iterator[Any], _Snapshots | None]:
        it = self._base_iter()
        snaps = _Snapshots(it, self) if self._stateful else None
        plan, p = self._current_plan(), self._progress
        p.head = keep = head_for(plan, TREE_OPS)
        head, p.resume_head = p.resume_head, None
        return iter_groups(snaps or it, plan, TREE_OPS, skip=skip, head=head, keep=keep), snaps

    def _stream(self, skip: int, tail: Any) -> Iterator[Any]:
        groups, snaps = self._groups(skip)
        rank = self.process_index
        for group in groups:
            part = group.parts[rank]
            if part is not None:
                tail.real = group.real
                yield part if snaps is None else _WithState(part, snaps.before_last)

    def _guarded(self, it: Iterator[Any]) -> Any:
        """``next(it)``, telling the other processes before raising if reading fails."""
        try:
            return next(it, _END)
        except Exception as exc:
            assert self._dispatcher is not None
            self._dispatcher.error(exc)
            raise

    def _dispatch_map(self, skip: int, tail: Any) -> Iterator[Any]:
        shard, dispatcher = self._shard, self._dispatcher
        assert shard is not None and dispatcher is not None
        meta = _Meta()
        shard.skip, shard.sink = skip, meta
        it = self._base_iter()
        parts: list[Any] = [None] * self.num_processes
        got = 0
        while (batch := self._guarded(it)) is not _END:
            rank, count, real, _ = meta.entries.popleft()
            parts[rank] = batch
            got += 1
            if got < count:
                continue
            dispatcher.send(parts, real)
            own, parts, got = parts[0], [None] * self.num_processes, 0
            if own is not None:
                tail.real = real
                yield own
        dispatcher.end()

    def _dispatch_stream(self, skip: int, tail: Any) -> Iterator[Any]:
        dispatcher = self._dispatcher
        assert dispatcher is not None
        try:
            groups, snaps = self._groups(skip)
        except Exception as exc:
            dispatcher.error(exc)
            raise
        while (group := self._guarded(groups)) is not _END:
            dispatcher.send(group.parts, group.real)
            own = group.parts[0]
            if own is not None:
                tail.real = group.real
                yield own if snaps is None else _WithState(own, snaps.before_last)
        dispatcher.end()

    def _receive(self, tail: Any) -> Iterator[Any]:
        dispatcher = self._dispatcher
        assert dispatcher is not None
        while True:
            kind, part, real = dispatcher.receive()
            if kind == "end":
                return
            if part is not None:
                tail.real = real
                yield part

    def __iter__(self) -> Iterator[Any]:
        from accel_core.state import GradientState

        gradient_state = GradientState()
        # Each request for a batch is a step boundary (see BatchBoundaryHook): a periodic checkpoint due
        # from the previous step is taken there, before the position moves on.
        boundary = self.batch_boundary_hook
        if boundary is not None:
            boundary(self)
        skip, _ = self._begin()
        p = self._progress
        tail = LastGroup()
        # Without workers each batch is fetched as its indices come: the shard reads the next indices ahead (cheap,
        # no dataset read) to tell the epoch's last batch. Reading the next *batch* ahead would run its transforms
        # and collate before the step on the current one draws (dropout): a checkpoint in that step would hold RNG
        # states past the read, and keeping the states from before each read cost ~60 us a batch (numpy's get_state).
        # Read after the step, as a plain DataLoader reads, the draws come in PyTorch's order and resume exactly.
        direct = self._shard is not None and self._dispatcher is None and self.num_workers == 0  # pyright: ignore[reportAttributeAccessIssue]  # a DataLoader mixin: its num_workers
        ahead = NextIndices() if direct else None
        if self._shard is not None:
            self._shard.next_indices = ahead
        source = self._source(skip, tail)
        place, device, non_blocking = self._place, self.device, self.non_blocking
        self.end_of_dataloader, self.remainder = False, -1
        gradient_state.register_dataloader(self)
        completed = False
        # This process's last step is the epoch's final one unless other processes have a step more.
        ends_epoch = not self._ends_before_others()

        def placed(item: Any) -> Any:
            # Placed as soon as read: read ahead (workers, streams), a non_blocking copy overlaps the current step.
            if not place:
                return item
            if type(item) is _WithState:
                item.batch = to_device(item.batch, device, non_blocking)  # pyright: ignore[reportArgumentType]  # placed only with a device
                return item
            return to_device(item, device, non_blocking)  # pyright: ignore[reportArgumentType]  # placed only with a device

        # Each batch with whether it is the epoch's last: from the shard's look at the next indices when fetched as its
        # indices come, else by reading (and placing) the next batch first.
        batches = (
            ((placed(batch), ahead.last) for batch in source) if ahead is not None else with_last(map(placed, source))
        )
        try:
            for current, last in batches:
                if last:
                    self.end_of_dataloader = True
                    self.remainder = tail.real
                    p.epoch_done = ends_epoch
                p.position += 1
                if type(current) is _WithState:
                    p.inner_state = current.state
                    current = current.batch
                yield current
                # After the last batch, the boundary is the epoch's end (below).
                if not last and boundary is not None:
                    boundary(self)
            completed = True
        finally:
            gradient_state.unregister_dataloader(self)
            if self._shard is not None:
                self._shard.skip, self._shard.sink, self._shard.next_indices = self._skip, None, None
            if completed:
                p.epoch += 1
                p.position, p.in_epoch, p.epoch_done, p.inner_state = 0, False, False, None
        if completed and boundary is not None:
            # The epoch's end is a boundary too: a checkpoint taken here resumes at the next epoch.
            boundary(self)

    def _ends_before_others(self) -> bool:
        """Whether this process's epoch has fewer steps than process 0's (``even_batches=False``, a short last step).

        Its last batch is then not the epoch's final step: a state saved there resumes this epoch, as the other
        processes' do, so every process opens (and synchronises) the same passes.
        """
        plan = self._current_plan()
        if plan.even_batches or self.num_processes == 1 or self._shard is None or self.process_index == 0:
            return False
        try:
            underlying = len(self._shard.batch_sampler)
        except TypeError:
            return False
        last = _last_batch_size(self._shard.batch_sampler)
        return batches_for_process(underlying, plan, self.process_index, last) < batches_for_process(
            underlying, plan, 0, last
        )

    def __len__(self) -> int:
        plan = self._current_plan()
        if self._shard is not None:
            underlying = len(self._shard.batch_sampler)
            last = _last_batch_size(self._shard.batch_sampler)
        else:
            underlying = len(self.base_dataloader)
            last = None
        return max(batches_for_process(underlying, plan, self.process_index, last) - self._skip, 0)


class DataLoaderShard(ShardedLoaderMixin, DataLoader):
    """The prepared ``torch.utils.data.DataLoader`` (see ``ShardedLoaderMixin``)."""
