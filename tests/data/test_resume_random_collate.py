"""A resume is exact when the data pipeline draws random numbers: transforms, a random collate, workers.

Without workers the prepared loader reads each batch when it is asked for it, after the step on the previous one
(it reads only the next batch's indices ahead), so the pipeline's draws and the step's (dropout) come in a plain
DataLoader's order. A checkpoint saved in the loop must let the resumed loader read the next batch with the same
draws: the batches (masks included) and the final weights must equal an uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from accel_core import Accelerator
from accel_core.random import set_seed

EPOCHS, STOP_AFTER = 2, 3  # 8 steps per epoch; the interrupted run saves after its 3rd step


class NoisyData(Dataset):
    """Random transforms from all three RNGs a transform may use."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> torch.Tensor:
        base = torch.full((6,), index / 32)
        return base + 0.1 * (torch.randn(6) + random.random() + float(np.random.rand()))


def masking_collate(items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    batch = torch.stack(items)
    return {"inputs": batch, "mask": torch.rand(batch.shape) < 0.5}


def _setup(
    num_workers: int, seed: int, prepare_loader: bool = True
) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer, DataLoader]:
    set_seed(seed)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(NoisyData(), batch_size=4, shuffle=True, collate_fn=masking_collate, num_workers=num_workers)
    model, optimizer = accelerator.prepare(model, optimizer)
    if prepare_loader:
        loader = accelerator.prepare(loader)
    return accelerator, model, optimizer, loader


def _train(
    accelerator, model, optimizer, loader, epochs: int, stop_after: int | None = None, save_to: Path | None = None
):
    """Trains; returns each step's batch (inputs and mask). With ``stop_after``, saves the state after that step."""
    seen: list[dict[str, torch.Tensor]] = []
    for _ in range(epochs):
        for batch in loader:
            seen.append({k: v.clone() for k, v in batch.items()})
            loss = (model(batch["inputs"] * batch["mask"]) ** 2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if stop_after is not None and len(seen) == stop_after:
                assert save_to is not None
                accelerator.save_state(str(save_to))
                return seen
    return seen


def _resumed(tmp_path: Path, num_workers: int):
    setup = _setup(num_workers, seed=0)
    first = _train(*setup, epochs=EPOCHS, stop_after=STOP_AFTER, save_to=tmp_path / "ckpt")
    accelerator, model, optimizer, loader = _setup(num_workers, seed=1234)  # another seed: the state decides
    accelerator.load_state(str(tmp_path / "ckpt"))
    state = loader.state_dict()
    assert state["batches_yielded"] == STOP_AFTER
    rest = _train(accelerator, model, optimizer, loader, epochs=EPOCHS)  # the rest of epoch 0, then epoch 1
    return first + rest, model


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_with_random_transforms_and_collate_is_bit_exact(tmp_path: Path, num_workers: int) -> None:
    reference = _setup(num_workers, seed=0)
    expected = _train(*reference, epochs=EPOCHS)
    batches, model = _resumed(tmp_path, num_workers)
    assert len(batches) == len(expected) == EPOCHS * 8
    for step, (got, want) in enumerate(zip(batches, expected, strict=True)):
        for key in want:
            assert torch.equal(got[key], want[key]), f"step {step}: {key} differs"
    for got, want in zip(model.parameters(), reference[1].parameters(), strict=True):
        assert torch.isfinite(want).all() and torch.equal(got, want)
    if num_workers == 0:
        # No batch read ahead: the same draws in the same order as a plain DataLoader's loop.
        plain = _train(*_setup(num_workers, seed=0, prepare_loader=False), epochs=EPOCHS)
        for step, (got, want) in enumerate(zip(expected, plain, strict=True)):
            for key in want:
                assert torch.equal(got[key], want[key]), f"step {step}: {key} differs from a plain DataLoader's"
