"""accel-data on 2 real processes (gloo, CPU), launched by test_data_multiprocess.py under torchrun.

Checks: gather_for_metrics sees every sample exactly once (lengths 99 and 92, batch sizes that do
not divide, split on/off, dispatch on/off, map-style and iterable, tensors and strings), through the
Accelerator and through the standalone API; RNG synchronisation of shuffled loaders seeded
differently on each process; mid-epoch resume after load_state_dict (with worker processes
drawing random transforms, too); dispatch of variable-length sequences; a reading error on
process 0 failing every process instead of hanging; a loader whose sampler yields index batches
(``sampler=BatchSampler(...), batch_size=None``) sharded like any other;
``split_between_processes`` on a ``datasets.Dataset``. Each ``@check`` is one test of test_data_multiprocess.py (the
harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from functools import cache

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, RandomSampler

from accel_core import ops
from accel_core.accelerator import Accelerator
from accel_core.state import GradientState
from accel_data import DataLoaderDispatcher, DispatchError, prepare_data_loader, skip_first_batches


class Items(Dataset):
    def __init__(self, length: int, fail_at: int | None = None) -> None:
        self.length, self.fail_at = length, fail_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        if i == self.fail_at:
            raise KeyError(f"sample {i} is corrupt")
        return {"idx": i, "x": torch.full((2,), float(i)), "name": f"s{i}"}


class Augmented(Dataset):
    """A random transform drawn from the global RNG, i.e. a DataLoader worker's own stream."""

    def __len__(self) -> int:
        return 45

    def __getitem__(self, i: int) -> dict:
        return {"idx": i, "x": torch.rand(())}


class Rows(Dataset):
    """Reads a whole batch per list of indices, as a Hugging Face ``datasets.Dataset`` does."""

    def __len__(self) -> int:
        return 50

    def __getitem__(self, indices: list[int]) -> dict:
        return {"idx": torch.tensor(indices), "x": torch.tensor(indices, dtype=torch.float32)}


class Stream(IterableDataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[dict]:
        for i in range(self.length):
            yield {"idx": i, "x": torch.full((2,), float(i)), "name": f"s{i}"}


class Sequences(Dataset):
    """Token sequences of varying length: batches change shape from one step to the next."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int) -> dict:
        return {"ids": torch.arange(1 + (i // 5) % 9) + i, "text": "w" * (i % 5)}


def pad_collate(samples: list[dict]) -> dict:
    longest = max(len(s["ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    for row, s in enumerate(samples):
        ids[row, : len(s["ids"])] = s["ids"]
    return {"ids": ids, "lengths": torch.tensor([len(s["ids"]) for s in samples]), "text": [s["text"] for s in samples]}


RANK = int(os.environ["RANK"])


def epoch_batches(loader) -> list:
    return [{k: (v.tolist() if torch.is_tensor(v) else v) for k, v in b.items()} for b in loader]


@cache
def shared_accelerator() -> Accelerator:
    """The Accelerator of the checks that use one; built by the first of them, in the process, never on import (a
    DataLoader worker started by spawn imports this file again)."""
    return Accelerator(cpu=True)


def make_resume_loader(case: str):
    if case == "iterable":
        return prepare_data_loader(DataLoader(Stream(45), batch_size=4))
    if case == "iterable-dispatch":
        return prepare_data_loader(DataLoader(Stream(45), batch_size=4), dispatch_batches=True)
    seedable = case == "seedable"
    torch.manual_seed(77 + RANK)
    dl = DataLoader(Items(45), batch_size=4, shuffle=True)
    return prepare_data_loader(
        dl, use_seedable_sampler=seedable, data_seed=11 if seedable else None, dispatch_batches=case == "dispatch"
    )


@check
def gather_for_metrics() -> None:
    accelerator = shared_accelerator()
    # The last step's remainder is what gather_for_metrics must drop: it depends on the length modulo the batch size
    # times 1 or 2 processes (6, 10, 12, 20; lcm 60). 92 leaves the remainders 512 left (92 = 512 - 7 * 60, 2-12
    # samples) in a fifth of the steps; 99 leaves others (3-19).
    combos = list(itertools.product(["map", "iterable"], [99, 92], [6, 10], [False, True], [False, True]))
    wrong: list[str] = []
    for kind, length, size, split, dispatch in combos:
        config = accelerator.dataloader_config
        config.split_batches, config.dispatch_batches = split, dispatch
        dataset = Items(length) if kind == "map" else Stream(length)
        loader = accelerator.prepare(DataLoader(dataset, batch_size=size))
        ids: list[int] = []
        names: list[str] = []
        whole_ids: list[int] = []
        whole_names: list[str] = []
        for batch in loader:
            ids += accelerator.gather_for_metrics(batch["idx"]).tolist()
            names += accelerator.gather_for_metrics(batch["name"])
            # The whole batch at once: a dict mixing a tensor and a list of strings, gathered per leaf.
            whole = accelerator.gather_for_metrics({"idx": batch["idx"], "name": batch["name"]})
            whole_ids += whole["idx"].tolist()
            whole_names += whole["name"]
        label = f"gather_for_metrics {kind} len={length} bs={size} split={split} dispatch={dispatch}"
        first_wrong = next((i for i, (a, b) in enumerate(zip(ids, range(length), strict=False)) if a != b), len(ids))
        # Every combination is tried; the check fails at the end naming each one that went wrong.
        if ids != list(range(length)):
            wrong.append(f"{label}: got {len(ids)} ids, first wrong at {first_wrong}")
        if names != [f"s{i}" for i in ids]:
            wrong.append(f"{label} names: {names[:5]}...")
        if not (whole_ids == ids and whole_names == names):
            wrong.append(f"{label} dict: {len(whole_ids)} ids, {len(whole_names)} names")
    config.split_batches, config.dispatch_batches = False, None
    expect(not wrong, "\n".join(wrong))


@check
def index_batch_sampler() -> None:
    accelerator = shared_accelerator()
    """``DataLoader(sampler=BatchSampler(RandomSampler(...)), batch_size=None)`` on processes seeded differently."""
    config = accelerator.dataloader_config
    for even, drop_last in itertools.product([True, False], [False, True]):
        config.even_batches = even
        torch.manual_seed(3000 + RANK)  # each process its own seed: the inner sampler must be synchronised
        rows = Rows()
        loader = accelerator.prepare(
            DataLoader(rows, sampler=BatchSampler(RandomSampler(rows), 4, drop_last), batch_size=None)
        )
        real = 48 if drop_last else 50  # drop_last leaves out the 2 samples of the short last batch
        label = f"index batches even={even} drop_last={drop_last}"
        for epoch in range(2):
            mine: list[int] = []
            gathered: list[int] = []
            count = 0
            for batch in loader:
                count += 1
                expect(batch["idx"].tolist() == batch["x"].long().tolist() and len(batch["idx"]) <= 4, f"{label} batch")
                mine += batch["idx"].tolist()
                if even:  # equal batches on every process: a plain gather works (it aborted gloo before)
                    gathered += accelerator.gather_for_metrics(batch["idx"]).tolist()
            everyone = ops.gather_object([mine])
            counts = ops.gather_object([count])
            expect(count == len(loader), f"{label} epoch {epoch} len: {count} batches, len {len(loader)}")
            distinct = set(i for ids in everyone for i in ids)
            expect(
                len(distinct) == real and distinct <= set(range(50)),
                f"{label} epoch {epoch} every sample: {sorted(distinct)}",
            )
            if even:
                expect(counts[0] == counts[1], f"{label} epoch {epoch} same steps: {counts}")
                expect(
                    sorted(gathered) == sorted(distinct),
                    f"{label} epoch {epoch} gather_for_metrics once each: {len(gathered)} ids",
                )
            else:
                expect(sum(map(len, everyone)) == real, f"{label} epoch {epoch} no repeat: {everyone}")
    config.even_batches = True


@check
def split_a_datasets_dataset() -> None:
    accelerator = shared_accelerator()
    """``split_between_processes`` on a Hugging Face ``datasets.Dataset``: each process its rows."""
    import datasets

    table = datasets.Dataset.from_dict({"prompt": [f"p{i}" for i in range(5)], "idx": list(range(5))})
    with accelerator.split_between_processes(table) as rows:
        expect(isinstance(rows, datasets.Dataset), f"split Dataset gives a Dataset: {type(rows).__name__}")
        everyone = ops.gather_object([rows["prompt"]])
    expect(everyone == [["p0", "p1", "p2"], ["p3", "p4"]], f"split Dataset: each row once, in order: {everyone}")
    with accelerator.split_between_processes(table, apply_padding=True) as rows:
        everyone = ops.gather_object([rows["idx"]])
    expect(everyone == [[0, 1, 2], [3, 4, 4]], f"split Dataset padded with the last row: {everyone}")


@check
def standalone_with_ops_gather() -> None:
    """prepare_data_loader without an Accelerator, the remainder rule applied by hand."""
    for kind, dispatch in itertools.product(["map", "iterable"], [False, True]):
        dataset = Items(99) if kind == "map" else Stream(99)
        loader = prepare_data_loader(DataLoader(dataset, batch_size=8), dispatch_batches=dispatch)
        seen: list[int] = []
        for batch in loader:
            gathered = ops.gather(batch["idx"])
            state = GradientState()
            if state.end_of_dataloader and state.remainder > 0:
                gathered = gathered[: state.remainder]
            seen += gathered.tolist()
        expect(seen == list(range(99)), f"standalone {kind} dispatch={dispatch}: {seen[-10:]}")


@check
def rng_sync_of_shuffled_loaders() -> None:
    """Every epoch reads each sample once over the processes. The loader's own generator (or a seedable sampler's
    seed) is broadcast at the first epoch only, and again after load_state_dict; a generator the user passed, which
    other code may draw from, at every epoch."""
    import accel_data.loader as loader_module

    broadcasts = []
    synchronize = loader_module.synchronize_rng_states

    def counted(*args, **kwargs):
        broadcasts.append(args[0])
        return synchronize(*args, **kwargs)

    loader_module.synchronize_rng_states = counted
    try:
        cases = {
            "own generator": (dict(shuffle=True), {}, 1),
            "seedable sampler": (dict(shuffle=True), dict(use_seedable_sampler=True), 1),
            "user's generator": (dict(shuffle=True, generator=torch.Generator().manual_seed(RANK)), {}, 4),
        }
        for case, (loader_args, prepare_args, expected) in cases.items():
            torch.manual_seed(1000 + RANK)  # processes seeded differently on purpose
            loader = prepare_data_loader(DataLoader(Items(64), batch_size=5, **loader_args), **prepare_args)
            broadcasts.clear()
            orders = []
            for epoch in range(4):
                ids = [i for b in loader for i in ops.gather(b["idx"]).tolist()]
                expect(sorted(ids[:64]) == list(range(64)), f"{case}, epoch {epoch}: {len(set(ids[:64]))} distinct")
                orders.append(ids[:64])
            expect(len({tuple(o) for o in orders}) == 4, f"{case}: each epoch has an order of its own")
            expect(len(broadcasts) == expected, f"{case}: {len(broadcasts)} synchronisations in 4 epochs")
        torch.manual_seed(3000 + RANK)
        own = prepare_data_loader(DataLoader(Items(64), batch_size=5, shuffle=True))
        epoch_batches(own)
        broadcasts.clear()
        own.load_state_dict(own.state_dict())
        for epoch in range(2):
            ids = [i for b in own for i in ops.gather(b["idx"]).tolist()]
            expect(sorted(ids[:64]) == list(range(64)), f"after load_state_dict, epoch {epoch}: not each sample once")
        expect(len(broadcasts) == 1, f"the first epoch after load_state_dict synchronises again: {broadcasts}")
    finally:
        loader_module.synchronize_rng_states = synchronize
    torch.manual_seed(2000 + RANK)
    synced = prepare_data_loader(DataLoader(Items(8), batch_size=2), rng_types=["torch"])
    next(iter(synced))
    values = ops.gather_object([torch.rand(1).item()])
    expect(values[0] == values[1], f"rng_types=['torch'] synchronises the global RNG: {values}")


@check
def resume() -> None:
    for case in ["shuffle", "seedable", "dispatch", "iterable", "iterable-dispatch"]:
        reference = make_resume_loader(case)
        epoch_batches(reference)
        expected = epoch_batches(reference)  # epoch 1
        following = epoch_batches(reference)  # epoch 2
        # Saved right after epoch 1's last step (inside the loop): the next iteration is epoch 2, with its order.
        for how in ("load_state_dict", "load_state_dict + skip_first_batches(0)"):
            run = make_resume_loader(case)
            epoch_batches(run)
            it = iter(run)
            for _ in expected:
                next(it)
            state, rng = run.state_dict(), torch.get_rng_state()
            it.close()
            resumed = make_resume_loader(case)
            resumed.load_state_dict(state)
            torch.set_rng_state(rng)  # as load_state does: a sampler without a generator draws from it
            if how != "load_state_dict":
                resumed = skip_first_batches(resumed, 0)
            got = epoch_batches(resumed)
            expect(got == following, f"resume {case} after an epoch's last step ({how}): {got} vs {following}")
        for stop in (1, len(expected) // 2, len(expected) - 1):
            run = make_resume_loader(case)
            epoch_batches(run)
            it = iter(run)
            head = [next(it) for _ in range(stop)]
            state = run.state_dict()
            it.close()
            resumed = make_resume_loader(case)
            resumed.load_state_dict(state)
            rest = epoch_batches(resumed)
            got = [{k: (v.tolist() if torch.is_tensor(v) else v) for k, v in b.items()} for b in head] + rest
            expect(got == expected, f"resume {case} at {stop}: {len(got)} vs {len(expected)} batches")


@check
def resume_with_workers() -> None:
    """Workers draw augmentation from their own RNG: a resumed epoch (load_state_dict, and then also
    skip_first_batches as Accelerate's scripts do) must give the remaining batches the same random
    values as the uninterrupted epoch, at odd and even stops (which worker loads the next batch)."""

    def make():
        torch.manual_seed(5 + RANK)
        return prepare_data_loader(DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=2))

    reference = make()
    epoch_batches(reference)
    expected = epoch_batches(reference)  # epoch 1
    for stop in (1, 2):
        run = make()
        epoch_batches(run)
        it = iter(run)
        head = [next(it) for _ in range(stop)]
        state = run.state_dict()
        it.close()
        for how in ("load_state_dict", "load_state_dict + skip_first_batches"):
            resumed = make()
            resumed.load_state_dict(state)
            if how != "load_state_dict":
                resumed = skip_first_batches(resumed, stop)
            rest = epoch_batches(resumed)
            got = [{k: v.tolist() for k, v in b.items()} for b in head] + rest
            expect(
                [b["idx"] for b in got] == [b["idx"] for b in expected],
                f"resume with workers at {stop} ({how}): same samples",
            )
            expect(
                got == expected,
                f"resume with workers at {stop} ({how}): same worker draws: "
                f"{[b['x'] for b in got[stop:]]} vs {[b['x'] for b in expected[stop:]]}",
            )


@check
def dispatch_variable_lengths() -> None:
    for split in (False, True):
        sharded = epoch_batches(
            prepare_data_loader(DataLoader(Sequences(), batch_size=6, collate_fn=pad_collate), split_batches=split)
        )
        dispatched = epoch_batches(
            prepare_data_loader(
                DataLoader(Sequences(), batch_size=6, collate_fn=pad_collate),
                split_batches=split,
                dispatch_batches=True,
            )
        )
        expect(dispatched == sharded, f"dispatch variable lengths split={split}: dispatched batches differ")
        widths = {len(b["ids"][0]) for b in dispatched}
        expect(len(widths) > 1, f"dispatch shapes vary split={split}: {widths}")


@check
def dispatch_large_batches_grow_the_slot() -> None:
    """Shares larger than the dispatcher's slot (64 KiB at first) make it grow, sizes up and down."""

    def collate(samples: list[int]) -> dict:
        width = 3000 * (1 + samples[0] % 5)  # 4 x 3000..15000 floats: 48..240 KB per share
        return {"x": torch.stack([torch.full((width,), float(i)) for i in samples]), "i": samples}

    sharding = prepare_data_loader(DataLoader(list(range(30)), batch_size=4, collate_fn=collate))
    sharded = epoch_batches(sharding)
    loader = prepare_data_loader(DataLoader(list(range(30)), batch_size=4, collate_fn=collate), dispatch_batches=True)
    dispatched = epoch_batches(loader)
    expect(dispatched == sharded, "dispatch of growing shares: dispatched batches differ")
    expect(
        isinstance(loader, DataLoaderDispatcher) and not isinstance(sharding, DataLoaderDispatcher),
        "isinstance(loader, DataLoaderDispatcher) says whether batches are dispatched",
    )
    expect(loader._dispatcher.capacity > 1 << 16, f"dispatch slot grew: {loader._dispatcher.capacity}")


@check
def data_parallel_subgroup() -> None:
    """Tensor-parallel peers share a batch: sharding over a group of one gives each the whole data."""
    groups = [dist.new_group([0]), dist.new_group([1])]  # every process creates every group
    loader = prepare_data_loader(DataLoader(Items(10), batch_size=3), group=groups[RANK], dispatch_batches=True)
    expect([i for b in loader for i in b["idx"].tolist()] == list(range(10)), "data-parallel group of one")
    expect(
        not isinstance(loader, DataLoaderDispatcher), "a group of one reads its own batches: not a DataLoaderDispatcher"
    )
    # Shuffled, with the RNG synchronised over the world (as the Accelerator prepares loaders): the peers draw the
    # same order from the global RNG, the first process's, which is the order plain PyTorch draws there.
    torch.manual_seed(7 + RANK)  # the peers' RNGs differ
    start = torch.get_rng_state()
    shuffled = prepare_data_loader(
        DataLoader(Items(12), batch_size=4, shuffle=True), group=groups[RANK], rng_over_world=True
    )
    expect(shuffled.sampler.generator is None, "a sampler read whole by each peer keeps drawing from the global RNG")
    orders = [[b["idx"] for b in epoch_batches(shuffled)] for _ in range(2)]
    everyone: list = [None, None]
    dist.all_gather_object(everyone, orders)
    expect(everyone[0] == everyone[1], f"peers drew different orders: {everyone}")
    if RANK == 0:
        torch.set_rng_state(start)
        plain = [[b["idx"].tolist() for b in DataLoader(Items(12), batch_size=4, shuffle=True)] for _ in range(2)]
        expect(orders == plain, f"peers' order {orders} is not plain PyTorch's {plain}")


@check
def dispatch_error_fails_everywhere() -> None:
    loader = prepare_data_loader(DataLoader(Items(40, fail_at=21), batch_size=4), dispatch_batches=True)
    try:
        for _ in loader:
            pass
    except DispatchError as error:
        expect(RANK != 0 and "corrupt" in str(error), f"dispatch error on the receiver: {error}")
    except KeyError:
        expect(RANK == 0, "dispatch error on process 0")
    else:
        expect(False, "dispatch error: no error raised")
    dist.barrier()  # both processes got here: nobody hung


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where it is, then fails
    run_checks(teardown=dist.destroy_process_group)
