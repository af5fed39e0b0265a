"""The prepared loader in one process: each process simulated with process_index=i, no process group."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from accel_core.state import GradientState
from accel_data import SeedableRandomSampler, prepare_data_loader, skip_first_batches


class Counting(Dataset):
    """Map-style dataset of dicts that counts the samples it had to load."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.loads = 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        self.loads += 1
        return {"idx": i, "x": torch.full((3,), float(i)), "name": f"s{i}"}


class Stream(IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[dict]:
        for i in range(self.length):
            yield {"idx": i, "x": torch.full((3,), float(i)), "name": f"s{i}"}


def _run(loader) -> tuple[list[list[int]], int, list[bool]]:
    out, ends = [], []
    for batch in loader:
        out.append(batch["idx"].tolist())
        assert batch["name"] == [f"s{i}" for i in batch["idx"].tolist()]
        ends.append(loader.end_of_dataloader)
    return out, loader.remainder, ends


def _collect(make, n: int, **kwargs) -> tuple[list[list[list[int]]], int]:
    per_rank, real = [], -1
    for rank in range(n):
        loader = prepare_data_loader(make(), num_processes=n, process_index=rank, **kwargs)
        batches, remainder, ends = _run(loader)
        if not isinstance(loader.dataset, IterableDataset):
            assert len(loader) == len(batches)
        if batches:
            assert ends == [False] * (len(batches) - 1) + [True], "end_of_dataloader on the last batch only"
        per_rank.append(batches)
        if rank == 0:
            real = remainder
    return per_rank, real


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_prepared_loader_shards_exactly(kind: str) -> None:
    for length, size, n, split, even, drop_last in itertools.product(
        [1, 7, 13, 31, 99], [1, 3, 4], [1, 2, 3], [False, True], [True, False], [False, True]
    ):
        loader_batch = size * n if split else size
        dataset = Counting(length) if kind == "map" else Stream(length)

        def make(dataset=dataset, loader_batch=loader_batch, drop_last=drop_last):
            return DataLoader(dataset, batch_size=loader_batch, drop_last=drop_last)

        per_rank, real = _collect(make, n, split_batches=split, even_batches=even)
        single = [b["idx"].tolist() for b in make()]
        kept = single if split or not drop_last else single[: len(single) // n * n]
        expected = [i for b in kept for i in b]
        steps = max(map(len, per_rank))
        got = []
        for t in range(steps):
            step = [i for r in range(n) for i in (per_rank[r][t] if t < len(per_rank[r]) else [])]
            got.extend(step[:real] if t == steps - 1 else step)
        assert got == expected, (kind, length, size, n, split, even, drop_last)
        if even:
            assert len({len(b) for b in per_rank}) == 1


def test_gradient_state_registration_and_cleanup() -> None:
    state = GradientState()
    loader = prepare_data_loader(DataLoader(range(10), batch_size=4), num_processes=1, process_index=0)
    assert state.active_dataloader is None
    seen = []
    for _ in loader:
        seen.append((state.active_dataloader is loader, state.end_of_dataloader, state.remainder))
    assert seen == [(True, False, -1), (True, False, -1), (True, True, 2)]
    assert state.active_dataloader is None and not state.in_dataloader
    for _ in loader:
        break
    assert state.active_dataloader is None, "an early break unregisters the loader"
    with pytest.raises(RuntimeError):
        for _ in loader:
            raise RuntimeError("boom")
    assert state.active_dataloader is None, "an exception unregisters the loader"


def test_nested_loaders_report_the_innermost() -> None:
    state = GradientState()
    outer = prepare_data_loader(DataLoader(range(4), batch_size=2), num_processes=1, process_index=0)
    inner = prepare_data_loader(DataLoader(range(3), batch_size=2), num_processes=1, process_index=0)
    for _ in outer:
        for _ in inner:
            assert state.active_dataloader is inner
        assert state.active_dataloader is outer
    assert state.active_dataloader is None


def test_remainder_with_padding() -> None:
    """Spec example: 9 samples, batch 5, two processes: the gathered last step keeps 9 - 0 real."""
    loaders = [
        prepare_data_loader(DataLoader(range(9), batch_size=5), num_processes=2, process_index=r) for r in range(2)
    ]
    batches = [list(loader) for loader in loaders]
    assert [b.tolist() for b in batches[0]] == [[0, 1, 2, 3, 4]]
    assert [b.tolist() for b in batches[1]] == [[5, 6, 7, 8, 0]]
    assert loaders[0].remainder == loaders[1].remainder == 9


def _epoch(loader) -> list[list[int]]:
    return [b["idx"].tolist() for b in loader]


@pytest.mark.parametrize("seedable", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_resume_mid_epoch_yields_exactly_the_rest_without_loading_skipped_samples(seedable: bool, split: bool) -> None:
    n, length = 2, 50

    def make(rank: int, dataset: Counting):
        dl = DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
        return prepare_data_loader(
            dl, num_processes=n, process_index=rank, split_batches=split, use_seedable_sampler=seedable, data_seed=3
        )

    for rank in range(n):
        reference = make(rank, Counting(length))
        first, second = _epoch(reference), _epoch(reference)
        for stop in [0, 1, len(first) // 2, len(first) - 1]:
            run = make(rank, Counting(length))
            _epoch(run)  # a full epoch first: the resume is of epoch 1
            it = iter(run)
            got = [next(it)["idx"].tolist() for _ in range(stop)]
            state = run.state_dict()
            del it
            assert state["epoch"] == 1 and state["batches_yielded"] == stop
            fresh_data = Counting(length)
            resumed = make(rank, fresh_data)
            resumed.load_state_dict(state)
            assert resumed.state_dict()["batches_yielded"] == stop, "saving again before iterating keeps the position"
            rest = _epoch(resumed)
            assert got + rest == second, (rank, stop)
            per_rank_batch = 2 if split else 4
            assert fresh_data.loads <= len(rest) * per_rank_batch, "skipped samples were loaded"
            # The epoch after the resumed one continues as the uninterrupted run would.
            third_ref = _epoch(reference)
            assert _epoch(resumed) == third_ref
            reference = make(rank, Counting(length))
            first, second = _epoch(reference), _epoch(reference)


class _GlobalRngPairs(Sampler[list[int]]):
    """A custom batch sampler shuffling from the global RNG, as a sampler without a generator does."""

    def __iter__(self):
        order = torch.randperm(12).tolist()
        return iter([order[i : i + 2] for i in range(0, 12, 2)])

    def __len__(self) -> int:
        return 6


class _ShuffledStream(IterableDataset):
    """An iterable dataset shuffling with its own generator, which the loader saves and restores."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(4)

    def __iter__(self) -> Iterator[dict]:
        for i in torch.randperm(18, generator=self.generator).tolist():
            yield {"idx": i}


def _epoch_end_loader(kind: str, rank: int):
    torch.manual_seed(0)  # a sampler without a generator is given one from it (several processes)
    kwargs: dict[str, Any] = {}
    if kind == "iterable":
        dl = DataLoader(_ShuffledStream(), batch_size=3)
    elif kind == "custom_batch_sampler":
        dl = DataLoader(Counting(12), batch_sampler=_GlobalRngPairs())
    elif kind == "unbatched":
        dl = DataLoader(Counting(12), batch_size=None, shuffle=True)
    else:
        generator = torch.Generator().manual_seed(2) if kind in ("generator", "split") else None
        dl = DataLoader(
            Counting(19 if kind == "uneven" else 20),
            batch_size=4 if kind == "split" else 3,
            shuffle=True,
            generator=generator,
        )
        kwargs = {
            "split_batches": kind == "split",
            "even_batches": kind != "uneven",
            "use_seedable_sampler": kind == "seedable",
            "data_seed": 3,
        }
    return prepare_data_loader(dl, num_processes=2, process_index=rank, **kwargs)


@pytest.mark.parametrize(
    "kind", ["shuffle", "generator", "seedable", "split", "uneven", "custom_batch_sampler", "unbatched", "iterable"]
)
def test_a_state_saved_after_an_epochs_last_step_resumes_with_the_next_epoch(kind: str) -> None:
    """Saved inside the loop right after epoch 1's last step, the position is epoch 2's start: iterating the
    resumed loader (or ``skip_first_batches(loader, 0)`` of it) gives epoch 2's order, then epoch 3's."""

    def as_list(batch: Any) -> Any:
        return batch["idx"].tolist() if torch.is_tensor(batch["idx"]) else batch["idx"]

    for rank in range(2):
        reference = _epoch_end_loader(kind, rank)
        epochs = [[as_list(b) for b in reference] for _ in range(4)]
        run = _epoch_end_loader(kind, rank)
        for _ in run:  # epoch 0
            pass
        it = iter(run)
        for _ in epochs[1]:
            next(it)
        assert run.end_of_dataloader
        # The state of the global RNG, which load_state restores (a sampler without a generator draws from it).
        state, rng = run.state_dict(), torch.get_rng_state()
        it.close()  # a loop left there with `break`: the same position
        closed = run.state_dict()
        assert (closed["epoch"], closed["batches_yielded"]) == (state["epoch"], state["batches_yielded"])
        if kind == "uneven" and rank == 1:
            # One step fewer than process 0: its last batch is not the epoch's final step, and it resumes the epoch
            # there (an empty pass), as process 0 resumes its last step, so both open the same passes.
            assert len(epochs[1]) == 3 and (state["epoch"], state["batches_yielded"]) == (1, 3)
            resumed = _epoch_end_loader(kind, rank)
            resumed.load_state_dict(state)
            torch.set_rng_state(rng)
            assert [as_list(b) for b in resumed] == []
            assert [[as_list(b) for b in resumed] for _ in range(2)] == epochs[2:]
            continue
        assert (state["epoch"], state["batches_yielded"]) == (2, 0)
        assert state["sampler_draw"] is None and state["base_seed_state"] is None
        for skip in (None, 0):
            resumed = _epoch_end_loader(kind, rank)
            resumed.load_state_dict(state)
            torch.set_rng_state(rng)
            first = resumed if skip is None else skip_first_batches(resumed, skip)
            got = [[as_list(b) for b in first], [as_list(b) for b in resumed]]
            assert got == epochs[2:], (kind, rank, skip)


def test_resume_with_another_number_of_processes() -> None:
    loader = prepare_data_loader(DataLoader(Counting(40), batch_size=2), num_processes=2, process_index=0)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()  # 4 steps x 2 processes = 8 batches of the original loader
    del it
    single = prepare_data_loader(DataLoader(Counting(40), batch_size=2), num_processes=1, process_index=0)
    single.load_state_dict(state)
    assert _epoch(single)[0] == [16, 17]
    four = prepare_data_loader(DataLoader(Counting(40), batch_size=2), num_processes=3, process_index=0)
    with pytest.raises(ValueError, match="whole number of steps"):
        four.load_state_dict(state)


def test_skip_first_batches_prepared_and_raw() -> None:
    loader = prepare_data_loader(DataLoader(Counting(20), batch_size=3), num_processes=2, process_index=1)
    full = _epoch(loader)
    skipped = skip_first_batches(loader, 2)
    assert _epoch(skipped) == full[2:]
    assert len(skipped) == len(full) - 2
    assert loader.epoch == skipped.epoch == 2, "the skipping loader shares the epoch counter"
    raw = DataLoader(Counting(10), batch_size=3)
    assert _epoch(skip_first_batches(raw, 1)) == [[3, 4, 5], [6, 7, 8], [9]]
    assert _epoch(skip_first_batches(raw, 5)) == []


def test_skip_after_load_state_dict_does_not_skip_twice() -> None:
    """Accelerate scripts call load_state, then skip_first_batches(loader, consumed) themselves."""

    def make():
        dl = DataLoader(Counting(30), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(3))
        return prepare_data_loader(dl, num_processes=2, process_index=0)

    full = _epoch(make())
    run = make()
    it = iter(run)
    for _ in range(3):
        next(it)
    state = run.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    assert _epoch(skip_first_batches(resumed, 3)) == full[3:]


def test_seedable_sampler_same_order_everywhere() -> None:
    orders = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        dl = DataLoader(Counting(12), batch_size=12, shuffle=True)
        loader = prepare_data_loader(dl, num_processes=1, process_index=0, use_seedable_sampler=True, data_seed=5)
        orders.append([_epoch(loader), _epoch(loader)])
    assert orders[0] == orders[1], "data_seed decides the order, not the global RNG"
    assert orders[0][0] != orders[0][1], "each epoch is shuffled differently"


def test_seedable_random_sampler_has_accelerates_constructor_and_behaviour() -> None:
    torch.manual_seed(11)
    default = SeedableRandomSampler(range(10))
    assert default.initial_seed == 11 and default.epoch == 0, "data_seed=None takes torch.initial_seed()"
    generator = torch.Generator()
    sampler = SeedableRandomSampler(range(10), False, 10, generator, data_seed=1)  # RandomSampler's positions
    assert sampler.generator is generator and sampler.initial_seed == 1
    first = list(sampler)
    assert sampler.epoch == 1, "a complete pass moves to the next epoch"
    second = list(sampler)
    assert first != second and sorted(first) == sorted(second) == list(range(10))
    sampler.set_epoch(0)
    assert list(sampler) == first
    expected = torch.randperm(10, generator=torch.Generator().manual_seed(1 + 1)).tolist()
    assert second == expected, "epoch e is the permutation of seed initial_seed + e"
    partial = iter(sampler)
    next(partial)
    assert sampler.epoch == 1, "an unfinished pass does not move the epoch"
    replaced = SeedableRandomSampler(range(10), replacement=True, num_samples=25, data_seed=3)
    assert len(list(replaced)) == 25


def test_set_epoch_is_forwarded() -> None:
    class EpochSampler(Sampler[int]):
        def __init__(self) -> None:
            self.epoch = -1

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            return iter(range(6))

        def __len__(self) -> int:
            return 6

    sampler = EpochSampler()
    loader = prepare_data_loader(
        DataLoader(Counting(6), batch_size=2, sampler=sampler), num_processes=2, process_index=0
    )
    loader.set_epoch(3)
    assert sampler.epoch == 3 and loader.epoch == 3
    assert loader.sampler is sampler, "the user's sampler is kept"


def test_custom_batch_sampler_and_unbatched_loader() -> None:
    class Pairs(Sampler[list[int]]):
        def __iter__(self):
            return iter([[5, 4], [3, 2], [1, 0]])

        def __len__(self) -> int:
            return 3

    loader = prepare_data_loader(DataLoader(Counting(6), batch_sampler=Pairs()), num_processes=2, process_index=1)
    assert _epoch(loader) == [[3, 2], [5, 4]]
    unbatched = [
        prepare_data_loader(DataLoader(Counting(5), batch_size=None), num_processes=2, process_index=r)
        for r in range(2)
    ]
    assert [[b["idx"] for b in u] for u in unbatched] == [[0, 2, 4], [1, 3, 0]]
    assert unbatched[0].remainder == 1  # the last step holds sample 4 and the padding 0


def test_workers_keep_the_partition() -> None:
    per_rank = []
    for rank in range(2):
        dl = DataLoader(
            Counting(23), batch_size=4, num_workers=2, shuffle=True, generator=torch.Generator().manual_seed(1)
        )
        per_rank.append(_epoch(prepare_data_loader(dl, num_processes=2, process_index=rank)))
    flat = [i for t in range(len(per_rank[0])) for r in range(2) for i in per_rank[r][t]]
    assert sorted(flat[:23]) == list(range(23))


def test_device_placement_and_preparing_twice() -> None:
    loader = prepare_data_loader(
        DataLoader(Counting(4), batch_size=2), num_processes=1, process_index=0, put_on_device=True, device="cpu"
    )
    assert all(b["x"].device.type == "cpu" for b in loader)
    assert prepare_data_loader(loader) is loader


def test_user_errors() -> None:
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        prepare_data_loader(DataLoader(range(10), batch_size=3), num_processes=2, process_index=0, split_batches=True)
    with pytest.raises(ValueError, match="process group"):
        prepare_data_loader(
            DataLoader(range(10), batch_size=2), num_processes=2, process_index=0, dispatch_batches=True
        )
    with pytest.raises(ValueError, match="Unknown rng_types"):
        prepare_data_loader(DataLoader(range(10), batch_size=2), num_processes=1, process_index=0, rng_types=["numpy"])
    with pytest.raises(ValueError, match="process_index"):
        prepare_data_loader(DataLoader(range(10), batch_size=2), num_processes=2, process_index=2)
    with pytest.raises(TypeError, match="DataLoader"):
        prepare_data_loader([1, 2, 3])  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(ValueError, match="batch size"):
        prepare_data_loader(
            DataLoader(range(10), batch_size=None), num_processes=2, process_index=0, split_batches=True
        )


def test_integration_preparer_is_discoverable() -> None:
    from accel_core import discovery
    from accel_core.protocols import DataLoaderPreparer

    preparer = discovery.load("accel.preparers", "dataloader")
    assert isinstance(preparer, DataLoaderPreparer)


def test_boundary_hook_hears_each_request_for_a_batch_and_the_epoch_end() -> None:
    """Where the Accelerator takes its periodic checkpoints: the position then counts exactly the batches consumed."""
    heard: list[tuple[int, int]] = []
    callers: list[object] = []

    def hook(loader: Any) -> None:
        callers.append(loader)
        heard.append((loader.epoch, loader.state_dict()["batches_yielded"]))

    prepared = prepare_data_loader(
        DataLoader(range(6), batch_size=2), num_processes=1, process_index=0, boundary_hook=hook
    )
    assert prepared.batch_boundary_hook is hook
    assert len(list(prepared)) == 3
    assert heard == [(0, 0), (0, 1), (0, 2), (1, 0)]  # before each batch, then after the epoch ended
    assert all(caller is prepared for caller in callers)
    heard.clear()
    for _ in prepared:  # a loop that stops early has no epoch end
        break
    assert heard == [(1, 0)]
    heard.clear()
    skipping = skip_first_batches(prepared, 2)
    callers.clear()
    assert [b.tolist() for b in skipping] == [[4, 5]]  # a derived loader reports alike, itself
    # First heard where the loop that stopped early left the epoch (one batch in), before the skip applies.
    assert heard == [(1, 1), (2, 0)] and callers == [skipping, skipping]
    assert prepare_data_loader(DataLoader(range(6))).batch_boundary_hook is None


def test_even_batches_can_be_switched_between_epochs() -> None:
    """Accelerator.join_uneven_inputs sets ``loader.even_batches`` for the length of a block."""

    class SizedStream(Stream):
        def __len__(self) -> int:
            return self.length

    for dataset in (Counting(9), SizedStream(9)):
        loader = prepare_data_loader(DataLoader(dataset, batch_size=4), num_processes=2, process_index=1)
        assert loader.even_batches and len(loader) == 2 and loader.total_batch_size == 8
        assert _epoch(loader) == [[4, 5, 6, 7], [3, 4, 5, 6]]  # last step: 8 then 0..6 as padding
        loader.even_batches = False
        assert _epoch(loader) == [[4, 5, 6, 7]] and len(loader) == 1
        loader.even_batches = True
        assert len(_epoch(loader)) == 2


class WorkerSeeds(Dataset):
    """Sample ``i`` is ``(i, the seed of the worker that loaded it)``."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return i, info.seed if info is not None else -1


@pytest.mark.parametrize("user_generator", [False, True])
def test_resume_replays_worker_seeds_and_leaves_the_global_rng_alone(user_generator: bool) -> None:
    """A resumed epoch draws its iterator's base seed (workers' seeds) as the interrupted one did.

    torch draws it from the loader's generator, else from the global RNG, when an iterator opens
    (as Accelerate's loader does). The resumed run restores the global RNG to the checkpoint's
    point (load_state) and must not draw from it again, or the dropout stream after resume shifts.
    """

    def make():
        generator = torch.Generator().manual_seed(5) if user_generator else None
        dl = DataLoader(WorkerSeeds(), batch_size=2, shuffle=True, num_workers=2, generator=generator)
        return prepare_data_loader(dl, num_processes=2, process_index=1)

    def rows(batches) -> list[list[int]]:
        return [[*b[0].tolist(), *b[1].tolist()] for b in batches]

    torch.manual_seed(0)
    run = make()
    list(run)  # epoch 0
    it = iter(run)
    got = [next(it) for _ in range(2)]
    state, rng_at_checkpoint = run.state_dict(), torch.get_rng_state()
    rest = list(it)
    assert rows(got + rest) and len({seed for b in got + rest for seed in b[1].tolist()}) == 2

    torch.manual_seed(123)  # a new run: whatever the RNG did before, load_state restores it
    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng_at_checkpoint)
    replayed = list(resumed)
    assert rows(replayed) == rows(rest), "same samples and same worker seeds as the interrupted epoch"
    assert torch.equal(torch.get_rng_state(), rng_at_checkpoint), "opening the resumed epoch drew from the global RNG"
