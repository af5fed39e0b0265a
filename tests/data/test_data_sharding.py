"""Sharding arithmetic, checked exhaustively over small cases without any process group.

The property: concatenating, step by step, the processes' batches in process order and keeping
the first ``real`` items of the last step gives exactly what one process reads from the same
loader, in the same order; with ``even_batches`` every process gets equally many, equally sized
batches and the padding repeats the start of the epoch.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, SequentialSampler

from accel_data.loader import TREE_OPS
from accel_data.samplers import BatchSamplerShard, LastGroup
from accel_data.sharding import LIST_OPS, ShardPlan, batches_for_process, iter_groups

LENGTHS = [1, 2, 5, 7, 10, 13, 16, 31, 99]
SIZES = [1, 2, 3, 4, 5, 8]
PROCESSES = [1, 2, 3, 4]


def _reference(length: int, loader_batch: int, drop_last: bool) -> list[list[int]]:
    return list(BatchSampler(SequentialSampler(range(length)), loader_batch, drop_last))


def _expected_flat(ref: list[list[int]], n: int, split: bool, drop_last: bool) -> list[int]:
    kept = ref if split or not drop_last else ref[: len(ref) // n * n]
    return [i for b in kept for i in b]


def _check_steps(
    per_rank: list[list[list[int]]], real: int, expected: list[int], n: int, even: bool, batch: int
) -> None:
    steps = max((len(b) for b in per_rank), default=0)
    flat: list[int] = []
    last_step: list[int] = []
    for t in range(steps):
        step = [i for r in range(n) if t < len(per_rank[r]) for i in per_rank[r][t]]
        if t == steps - 1:
            last_step = step
        else:
            flat.extend(step)
    if steps:
        assert 0 < real <= len(last_step)
        flat.extend(last_step[:real])
        padding = last_step[real:]
        if even:
            cycle = list(itertools.islice(itertools.cycle(expected), len(padding)))
            assert padding == cycle, "padding must repeat the start of the epoch"
        else:
            assert padding == []
    assert flat == expected
    if even:
        assert len({len(b) for b in per_rank}) <= 1, "even_batches: every process gets as many batches"
        if n > 1:
            assert all(len(x) == batch for b in per_rank for x in b), "even_batches: every batch full size"


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("even", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_shard_partitions_exactly(split: bool, even: bool, drop_last: bool) -> None:
    cases = 0
    for length, size, n in itertools.product(LENGTHS, SIZES, PROCESSES):
        loader_batch = size * n if split else size
        ref = _reference(length, loader_batch, drop_last)
        expected = _expected_flat(ref, n, split, drop_last)
        per_rank, real = [], -1
        for rank in range(n):
            shard = BatchSamplerShard(
                BatchSampler(SequentialSampler(range(length)), loader_batch, drop_last), n, rank, split, even
            )
            sink = LastGroup()
            shard.sink = sink
            batches = list(shard)
            assert len(shard) == len(batches), (length, size, n, rank)
            plan = shard.plan()
            last = len(ref[-1]) if ref else None
            assert batches_for_process(len(ref), plan, rank, last) == len(batches)
            per_rank.append(batches)
            if rank == 0:
                real = sink.real
        _check_steps(per_rank, real, expected, n, even, size)
        if n == 1:
            assert per_rank[0] == ref, "a single process reads the loader unchanged"
        cases += 1
    assert cases == len(LENGTHS) * len(SIZES) * len(PROCESSES)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("even", [True, False])
def test_dispatch_order_yields_every_process_batches(split: bool, even: bool) -> None:
    """``process_index=None`` (what the dispatching process loads) = the processes' batches, step by step."""
    for length, size, n in itertools.product([5, 13, 31], [2, 3], [2, 3]):
        loader_batch = size * n if split else size

        def make(rank, length=length, loader_batch=loader_batch, n=n):
            return BatchSamplerShard(
                BatchSampler(SequentialSampler(range(length)), loader_batch, False), n, rank, split, even
            )

        per_rank = [list(make(r)) for r in range(n)]
        interleaved = [per_rank[r][t] for t in range(max(map(len, per_rank))) for r in range(n) if t < len(per_rank[r])]
        everything = make(None)
        assert list(everything) == interleaved
        assert len(everything) == len(interleaved)


def test_tree_ops_match_list_ops() -> None:
    """Collated batches (iterable datasets, dispatch) are shared exactly like index lists."""
    for length, size, n, split, even, drop_last in itertools.product(
        [7, 16, 31], [2, 4], [2, 3], [False, True], [True, False], [False, True]
    ):
        loader_batch = size * n if split else size
        ref = _reference(length, loader_batch, drop_last)
        plan = ShardPlan(n, split, even, drop_last, loader_batch)
        tensors = [
            {"x": torch.tensor(b), "name": [f"s{i}" for i in b], "pair": (torch.tensor(b) * 2, torch.tensor(b))}
            for b in ref
        ]
        by_list = list(iter_groups(ref, plan, LIST_OPS))
        by_tree = list(iter_groups(tensors, plan, TREE_OPS))
        assert len(by_list) == len(by_tree)
        for a, b in zip(by_list, by_tree, strict=True):
            assert a.real == b.real and a.final == b.final
            for pa, pb in zip(a.parts, b.parts, strict=True):
                if pa is None:
                    assert pb is None
                    continue
                assert pb["x"].tolist() == pa
                assert pb["name"] == [f"s{i}" for i in pa]
                assert pb["pair"][0].tolist() == [2 * i for i in pa]


class _Buckets:
    """A custom batch sampler of varying batch sizes (no ``batch_size`` attribute)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __iter__(self):
        start = 0
        for s in self.sizes:
            yield list(range(start, start + s))
            start += s

    def __len__(self) -> int:
        return len(self.sizes)


def test_variable_batches_pad_with_whole_batches() -> None:
    sizes = [3, 1, 4, 1, 5]
    flat = list(range(sum(sizes)))
    per_rank = [list(BatchSamplerShard(_Buckets(sizes), 2, r, False, True)) for r in range(2)]
    assert per_rank[0] == [[0, 1, 2], [4, 5, 6, 7], [9, 10, 11, 12, 13]]
    assert per_rank[1] == [[3], [8], [0, 1, 2]]  # the missing batch is the epoch's first
    sink = LastGroup()
    shard = BatchSamplerShard(_Buckets(sizes), 2, 0, False, True)
    shard.sink = sink
    list(shard)
    assert sink.real == 5
    got = [i for t in range(3) for r in range(2) for i in per_rank[r][t]]
    assert got[: len(got) - 3] == flat


def test_skip_equals_dropping_steps() -> None:
    """Skipping at the sampler level (fast path) and generically give the batches a full epoch has left."""
    for length, size, n, split, even in itertools.product([7, 16, 31], [2, 3], [1, 2, 3], [False, True], [True, False]):
        loader_batch = size * n if split else size
        for rank in range(n):
            full = list(
                BatchSamplerShard(
                    BatchSampler(SequentialSampler(range(length)), loader_batch, False), n, rank, split, even
                )
            )
            for skip in range(len(full) + 2):
                fast = BatchSamplerShard(
                    BatchSampler(SequentialSampler(range(length)), loader_batch, False), n, rank, split, even
                )
                fast.skip = skip
                generic = BatchSamplerShard(
                    _Buckets([len(b) for b in _reference(length, loader_batch, False)]), n, rank, split, even
                )
                generic.skip = skip
                assert list(fast) == full[skip:], (length, size, n, split, even, rank, skip)
                if not split or loader_batch % n == 0:
                    # The generic path knows no batch size: it pads with whole batches, so compare
                    # only the steps before the last.
                    assert list(generic)[: max(len(full) - skip - 1, 0)] == full[skip:-1]
                assert len(fast) == max(len(full) - skip, 0)


def test_split_needs_a_divisible_batch() -> None:
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        BatchSamplerShard(BatchSampler(SequentialSampler(range(10)), 3, False), 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        list(iter_groups([[1, 2, 3], [4, 5]], ShardPlan(2, split_batches=True), LIST_OPS))


class _CountingSampler:
    """Yields ``range(length)`` and records how far it was read, as a shuffle's draws depend on it."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.read = 0
        self.exhausted = False

    def __iter__(self):
        for i in range(self.length):
            self.read += 1
            yield i
        self.exhausted = True  # torch's RandomSampler draws another permutation here

    def __len__(self) -> int:
        return self.length


class _UserBatchSampler(BatchSampler):
    """A batch sampler class of the user's (read batch by batch, not by the index fast path)."""


@pytest.mark.parametrize("user_class", [False, True])
def test_shard_reads_no_further_than_the_step_handed_out(user_class: bool) -> None:
    """Accelerate's shard reads its batch sampler only as far as the step it yields: a loop left early
    (early stopping) must leave the sampler, and so its generator, where Accelerate's leaves it."""
    cls = _UserBatchSampler if user_class else BatchSampler
    for length, size, n, split, even, drop_last in itertools.product(
        [7, 16, 24, 31], [2, 3], [1, 2, 3], [False, True], [True, False], [False, True]
    ):
        loader_batch = size * n if split else size
        chunk = loader_batch if split else loader_batch * n
        for rank in range(n):
            sampler = _CountingSampler(length)
            it = iter(BatchSamplerShard(cls(sampler, loader_batch, drop_last), n, rank, split, even))
            for step in range(length // chunk):
                next(it)
                assert (sampler.read, sampler.exhausted) == ((step + 1) * chunk, False), (
                    length,
                    size,
                    n,
                    split,
                    even,
                    drop_last,
                    rank,
                    step,
                )
