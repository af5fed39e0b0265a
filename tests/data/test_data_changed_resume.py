"""Resuming after the dataset changed length (or the batch size changed): refused mid-epoch, or a stated policy.

Before, a checkpoint taken mid-epoch over 64 samples resumed over 48, 63 or 80 with exit code 0 and no message, and
that epoch saw 9 to 14 samples twice and missed others. Real ``save_state`` / ``load_state`` on one process here; the
same on two processes is checked in tests/checkpoint/mp_checkpoint.py (``data changed refused OK``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from accel_core import Accelerator, set_seed


class Numbers(Dataset):
    """Sample i is i; its length can change between runs, as a dataset on disk that grew or shrank."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> int:
        return i


def _run(length: int, batch_size: int = 8) -> tuple[Accelerator, Numbers, DataLoader]:
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    data = Numbers(length)
    loader = accelerator.prepare(DataLoader(data, batch_size=batch_size, shuffle=True))
    return accelerator, data, loader


def _save_mid_epoch(tmp_path: Path, steps: int = 3) -> tuple[Accelerator, Numbers, DataLoader, str, list[int]]:
    accelerator, data, loader = _run(64)
    seen: list[int] = []
    for step, batch in enumerate(loader):
        seen += batch.tolist()
        if step + 1 == steps:
            folder = accelerator.save_state(str(tmp_path / "ckpt"))
            break
    return accelerator, data, loader, folder, seen


@pytest.mark.parametrize("length", [48, 63, 80])
def test_a_changed_dataset_length_mid_epoch_is_refused_naming_the_change(tmp_path: Path, length: int) -> None:
    accelerator, data, loader, folder, _seen = _save_mid_epoch(tmp_path)
    data.length = length
    before = loader.state_dict()
    with pytest.raises(ValueError) as caught:
        accelerator.load_state(folder)
    message = str(caught.value)
    print(message)
    assert message == (
        f"Cannot resume the dataloader mid-epoch: its data changed since the checkpoint (dataset length 64 -> "
        f"{length}). The checkpoint had consumed 3 steps of epoch 0, counted in the old layout, so resuming there "
        "would repeat some samples and skip others. Resume with the data the checkpoint was saved with, or set "
        "ACCEL_DATA_CHANGED=restart_epoch to restart epoch 0 from its first step over the data of now."
    )
    after = loader.state_dict()
    assert after["batches_yielded"] == before["batches_yielded"] and after["epoch"] == before["epoch"]
    data.length = 64
    accelerator.load_state(folder)  # the same data as saved: resumes
    assert loader.state_dict()["batches_yielded"] == 3


def test_a_changed_batch_size_mid_epoch_is_refused(tmp_path: Path) -> None:
    _accelerator, _data, _loader, folder, _seen = _save_mid_epoch(tmp_path)
    accelerator, _data, _loader = _run(64, batch_size=16)
    with pytest.raises(ValueError, match=r"its data changed since the checkpoint \(batch size 8 -> 16\)"):
        accelerator.load_state(folder)


def test_restart_epoch_policy_reads_the_new_data_once_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    accelerator, data, loader, folder, _seen = _save_mid_epoch(tmp_path)
    data.length = 80
    monkeypatch.setenv("ACCEL_DATA_CHANGED", "restart_epoch")
    with caplog.at_level(logging.WARNING, logger="accel_data"):
        accelerator.load_state(folder)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("accel_data")] == [
        "The dataloader's data changed since the checkpoint (dataset length 64 -> 80); "
        "ACCEL_DATA_CHANGED=restart_epoch: epoch 0 restarts from its first step over the data of now "
        "(the checkpoint had consumed 3 of its steps, which are read again)."
    ]
    assert loader.state_dict()["batches_yielded"] == 0 and loader.state_dict()["epoch"] == 0
    resumed = [i for batch in loader for i in batch.tolist()]
    assert sorted(resumed) == list(range(80))  # every sample of the new data once
    monkeypatch.setenv("ACCEL_DATA_CHANGED", "ignore")
    with pytest.raises(
        ValueError, match=r"ACCEL_DATA_CHANGED='ignore': use 'error' \(the default\) or 'restart_epoch'"
    ):
        accelerator.load_state(folder)


def test_at_an_epoch_start_a_change_is_reported_and_the_epoch_reads_the_new_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    accelerator, data, loader = _run(64)
    for _batch in loader:
        pass
    folder = accelerator.save_state(str(tmp_path / "boundary"))  # after the epoch: the next epoch's start
    data.length = 63
    with caplog.at_level(logging.WARNING, logger="accel_data"):
        accelerator.load_state(folder)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("accel_data")] == [
        "The dataloader's data changed since the checkpoint (dataset length 64 -> 63). The checkpoint was taken at the "
        "start of epoch 1, so the resumed run reads that epoch whole, over the data of now."
    ]
    assert sorted(i for batch in loader for i in batch.tolist()) == list(range(63))


def test_unchanged_data_resumes_the_epoch_exactly(tmp_path: Path) -> None:
    """The check engages only on a change: the same data resumes where it stopped, each sample once."""
    _accelerator, _data, _loader, folder, seen = _save_mid_epoch(tmp_path)
    state = torch.load(Path(folder) / "dataloader_0_rank_0.pt", weights_only=True)["state"]
    assert (state["dataset_length"], state["batch_size"], state["drop_last"]) == (64, 8, False)
    accelerator2, _data2, loader2 = _run(64)
    accelerator2.load_state(folder)
    rest = [i for batch in loader2 for i in batch.tolist()]
    assert len(seen) == 24 and sorted(seen + rest) == list(range(64))
