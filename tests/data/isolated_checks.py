"""accel-data on its own: run under torchrun in an environment holding only accel-core, accel-data
(with its ``stateful`` extra, torchdata) and torch — no Accelerator, no meta-package.

Launched by tests/packaging/test_wheels.py in the environment the README's install commands build from the
wheels (`accel-data`, then `accel-data[stateful]`). Checks a hand-written loop over prepared loaders (map-style
shuffled, iterable, dispatch) sees every sample once with the remainder rule; torchdata's
StatefulDataLoader is accepted and a stateful iterable dataset resumes without re-reading. Each ``@check`` is one
test there (the harness: tests/harness/checklist.py, on PYTHONPATH; it needs only the standard library).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from torch.utils.data import DataLoader, Dataset, IterableDataset

from accel_data import prepare_data_loader

RANK = int(os.environ["RANK"])
dist.init_process_group("gloo")


class Items(Dataset):
    def __len__(self) -> int:
        return 53

    def __getitem__(self, i: int) -> dict:
        return {"idx": i, "name": f"s{i}"}


class CountingStream(IterableDataset):
    """An iterable dataset that torchdata can checkpoint: it remembers how far it got."""

    def __init__(self, length: int) -> None:
        self.length, self.pos, self.reads = length, 0, 0

    def __iter__(self) -> Iterator[dict]:
        while self.pos < self.length:
            i = self.pos
            self.pos += 1
            self.reads += 1
            yield {"idx": i}
        self.pos = 0

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


def gathered_epoch(loader) -> list[int]:
    """Hand-written evaluation loop: gather every step, drop the padding of the last one."""
    seen: list[int] = []
    for batch in loader:
        # A hand-written loop with torch's own tensor collectives: no accel helper involved.
        parts = [torch.empty_like(batch["idx"]) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, batch["idx"])
        step = torch.cat(parts).tolist()
        if loader.end_of_dataloader and loader.remainder > 0:
            step = step[: loader.remainder]
        seen += step
    return seen


@check
def only_accel_core_and_accel_data() -> None:
    expect(
        importlib.util.find_spec("accel") is None and importlib.util.find_spec("accel_checkpoint") is None,
        "only accel-core and accel-data",
    )


@check
def hand_written_loop_over_a_shuffled_map_style_loader() -> None:
    torch.manual_seed(RANK)  # differently seeded processes: the loader synchronises the shuffle
    shuffled = prepare_data_loader(DataLoader(Items(), batch_size=5, shuffle=True))
    expect(sorted(gathered_epoch(shuffled)) == list(range(53)), "map-style shuffled")


def expect_every_sample_once(dispatch: bool) -> None:
    stream = prepare_data_loader(DataLoader(CountingStream(53), batch_size=5), dispatch_batches=dispatch)
    expect(gathered_epoch(stream) == list(range(53)), f"iterable dispatch={dispatch}")
    mapped = prepare_data_loader(DataLoader(Items(), batch_size=5), dispatch_batches=dispatch)
    expect(gathered_epoch(mapped) == list(range(53)), f"map-style dispatch={dispatch}")


@check
def hand_written_loops_each_process_loading() -> None:
    expect_every_sample_once(dispatch=False)


@check
def hand_written_loops_with_dispatched_batches() -> None:
    expect_every_sample_once(dispatch=True)


@check
def stateful_dataloader_is_prepared_and_resumes_without_rereading() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make(dataset):
        return prepare_data_loader(StatefulDataLoader(dataset, batch_size=4))

    reference = [b["idx"].tolist() for b in make(CountingStream(45))]
    expect(isinstance(make(CountingStream(3)), StatefulDataLoader), "StatefulDataLoader prepared")
    for stop in (1, 3, len(reference) - 1):
        run = make(CountingStream(45))
        it = iter(run)
        head = [next(it)["idx"].tolist() for _ in range(stop)]
        state = run.state_dict()
        it.close()
        dataset = CountingStream(45)
        resumed = make(dataset)
        resumed.load_state_dict(state)
        rest = [b["idx"].tolist() for b in resumed]
        expect(head + rest == reference, f"stateful iterable resume at {stop}: {head + rest} vs {reference}")
        consumed = stop * dist.get_world_size() * 4  # samples of the steps before the checkpoint
        expect(
            dataset.reads <= 45 - consumed,
            f"stateful resume reads only the rest at {stop}: read {dataset.reads}, {45 - consumed} left",
        )
    plain = prepare_data_loader(DataLoader(Items(), batch_size=4), use_stateful_dataloader=True)
    expect(isinstance(plain, StatefulDataLoader), "use_stateful_dataloader=True")
    expect(sorted(gathered_epoch(plain)) == list(range(53)), "use_stateful_dataloader loop")


if __name__ == "__main__":
    run_checks(teardown=dist.destroy_process_group)
