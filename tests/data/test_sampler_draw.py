"""A sampler without a generator, read by one process, draws each epoch's order as in plain PyTorch.

torch's random samplers with ``generator=None`` draw from the global RNG when a pass starts, after
whatever the script drew since ``set_seed`` (model init, dropout of the previous epoch). A prepared
loader on one process must give the same batches and leave the global RNG where plain PyTorch
leaves it (Accelerate does: the Megatron example's numbers depended on it), and a resumed epoch
must still replay the interrupted epoch's order without drawing from the restored RNG.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from accel_core import Accelerator
from accel_core.random import set_seed
from accel_data import prepare_data_loader


def _loader(kind: str, num_workers: int = 0) -> DataLoader:
    data = list(range(32))
    if kind == "shuffle":
        return DataLoader(data, batch_size=4, shuffle=True, num_workers=num_workers)
    if kind == "subset":
        return DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(range(0, 32, 2)))
    if kind == "weighted":
        return DataLoader(data, batch_size=4, sampler=WeightedRandomSampler(torch.rand(32), 16))
    if kind == "replacement":
        return DataLoader(data, batch_size=4, sampler=RandomSampler(data, replacement=True, num_samples=20))
    raise ValueError(kind)


def _script(prepare: bool, kind: str, num_workers: int = 0) -> tuple[list[list[list[int]]], torch.Tensor]:
    """A training script's shape: seed, build a model (draws), loop 2 epochs with a random step."""
    set_seed(42)
    accelerator = Accelerator(cpu=True) if prepare else None
    torch.nn.Linear(16, 16)  # the model's init draws from the global RNG before the loop
    loader = _loader(kind, num_workers)
    if accelerator is not None:
        loader = accelerator.prepare(loader)
    epochs = []
    for _ in range(2):
        batches = []
        for batch in loader:
            batches.append(batch.tolist())
            torch.rand(3)  # the step's dropout
        epochs.append(batches)
    return epochs, torch.get_rng_state()


@pytest.mark.parametrize(("kind", "num_workers"), [("shuffle", 0), ("shuffle", 2), ("subset", 0), ("weighted", 0)])
def test_one_process_draws_each_epoch_as_pytorch(kind: str, num_workers: int) -> None:
    plain, plain_rng = _script(False, kind, num_workers)
    prepared, prepared_rng = _script(True, kind, num_workers)
    assert prepared == plain, "the prepared loader's batches differ from plain PyTorch's"
    assert plain[0] != plain[1], "each epoch draws a new order"
    assert torch.equal(prepared_rng, plain_rng), "the global RNG does not end where plain PyTorch leaves it"


@pytest.mark.parametrize("kind", ["shuffle", "subset", "replacement"])
def test_resumed_epoch_replays_the_drawn_order_and_leaves_the_restored_rng_alone(kind: str) -> None:
    def make() -> DataLoader:
        torch.nn.Linear(16, 16)  # draws between seeding and the loop
        return prepare_data_loader(_loader(kind), num_processes=1, process_index=0)

    torch.manual_seed(0)
    uninterrupted = make()
    [b.tolist() for b in uninterrupted]  # epoch 0
    second = [(b.tolist(), torch.rand(2)) for b in uninterrupted]  # epoch 1, each step drawing
    third = [b.tolist() for b in uninterrupted]

    torch.manual_seed(0)
    run = make()
    [b.tolist() for b in run]
    it = iter(run)
    got = []
    for _ in range(2):
        got.append((next(it).tolist(), torch.rand(2)))
    state, rng_at_checkpoint = run.state_dict(), torch.get_rng_state()
    del it
    assert state["batches_yielded"] == 2 and state["sampler_draw"] is not None

    torch.manual_seed(123)  # a new process: whatever it drew, load_state restores the checkpoint's RNG
    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng_at_checkpoint)
    rest = [(b.tolist(), torch.rand(2)) for b in resumed]
    assert [b for b, _ in got + rest] == [b for b, _ in second], "the resumed epoch has another order"
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got + rest, second, strict=True)), (
        "the resumed epoch drew from the restored global RNG"
    )
    assert [b.tolist() for b in resumed] == third, "the epoch after the resumed one differs"


def test_several_processes_share_a_generator_as_accelerate() -> None:
    """Sharded over processes, the sampler gets a generator at prepare (synchronised at each epoch);
    read by one process it keeps none."""
    one = DataLoader(range(8), batch_size=2, shuffle=True)
    prepare_data_loader(one, num_processes=1, process_index=0)
    assert one.sampler.generator is None
    two = DataLoader(range(8), batch_size=2, shuffle=True)
    prepare_data_loader(two, num_processes=2, process_index=0)
    assert isinstance(two.sampler.generator, torch.Generator)
