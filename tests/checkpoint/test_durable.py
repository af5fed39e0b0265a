"""save_state(durable=...) / ACCEL_CHECKPOINT_FSYNC: whether the files are fsynced before the checkpoint counts."""

from __future__ import annotations

import os

import pytest
import torch

from accel_core import Accelerator


@pytest.fixture
def fsynced(monkeypatch):
    """Paths of the regular files fsynced during the test (os.fsync still runs)."""
    paths: list[str] = []
    real = os.fsync

    def spy(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isfile(path):
            paths.append(os.path.basename(path))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return paths


class ShardWriter:
    """A strategy's own sharded checkpointing (the accel-checkpoint interface) that, like DeepSpeed's,
    writes with torch.save and does not fsync: the model goes to ``sharded/shards/model.pt``."""

    def __init__(self, model):
        self.model = model

    def save_sharded(self, accelerator, folder, **kwargs):
        os.makedirs(os.path.join(folder, "shards"))
        torch.save(self.model.state_dict(), os.path.join(folder, "shards", "model.pt"))
        return ("models",)

    def load_sharded(self, accelerator, folder, **kwargs):
        self.model.load_state_dict(torch.load(os.path.join(folder, "shards", "model.pt"), weights_only=True))


def prepared(sharded=False):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(2, 4)).sum())
    optimizer.step()
    if sharded:
        writer = ShardWriter(model)
        accelerator.strategy.save_sharded = writer.save_sharded
        accelerator.strategy.load_sharded = writer.load_sharded
    return accelerator, model


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name fsynced files")
@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
@pytest.mark.parametrize("how", ["default", "argument", "environment"])
def test_durable_by_default_and_switchable(tmp_path, monkeypatch, fsynced, how, sharded):
    accelerator, model = prepared(sharded)
    kwargs = {}
    if how == "argument":
        kwargs["durable"] = False
    elif how == "environment":
        monkeypatch.setenv("ACCEL_CHECKPOINT_FSYNC", "0")
    folder = accelerator.save_state(str(tmp_path / "ckpt"), **kwargs)
    data_files = {"model.pt" if sharded else "model.safetensors", "optimizer.bin", "random_states_0.pt"}
    if how == "default":
        assert data_files | {"COMPLETE"} <= set(fsynced)
    else:
        assert not data_files & set(fsynced)
    assert os.path.isdir(os.path.join(folder, "sharded")) == sharded
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(folder)  # complete and loadable either way
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())


def test_bad_switch_value_names_the_variable_and_writes_nothing(tmp_path, monkeypatch):
    accelerator, _ = prepared()
    monkeypatch.setenv("ACCEL_CHECKPOINT_FSYNC", "maybe")
    with pytest.raises(ValueError, match=r"ACCEL_CHECKPOINT_FSYNC='maybe'.*set it to 1"):
        accelerator.save_state(str(tmp_path / "ckpt"))
    assert os.listdir(tmp_path) == []
