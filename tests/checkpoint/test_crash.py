"""SIGKILL in the middle of save_state leaves the previous checkpoint as the one resumed from."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration

HERE = Path(__file__).resolve().parent
MODES = ("sync", "async")


def _wait_for(path: Path, child: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if child.poll() is not None:
            raise AssertionError(f"child exited with {child.returncode} before the kill:\n{child.stdout.read()}")
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError(f"timed out waiting for {path.name}:\n{child.stdout.read()}")
        time.sleep(0.01)


@pytest.mark.slow
def test_sigkill_mid_save_then_a_new_process_resumes(tmp_path):
    children = {}
    for mode in MODES:  # both children run at the same time: each pays torch's start-up once
        (tmp_path / mode).mkdir()
        children[mode] = subprocess.Popen(
            [sys.executable, str(HERE / "crash_child.py"), mode, str(tmp_path / mode), str(tmp_path / mode)],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for mode, child in children.items():
        _wait_for(tmp_path / mode / "writing", child)
        if mode == "async":
            _wait_for(tmp_path / mode / "returned", child)  # save_state returned while the writer worked
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        assert child.returncode == -signal.SIGKILL

    for mode in MODES:
        base = tmp_path / mode / "checkpoints"
        assert sorted(os.listdir(base))[-1] == "checkpoint_0" and not (base / "checkpoint_1").exists(), mode
        (partial,) = glob.glob(str(base / ".checkpoint_1.partial-*"))
        written = set(os.listdir(partial))
        # Killed mid-write: the stalled file is open (files are written several at once, so which of the others
        # have been started by then varies), no marker.
        assert "custom_checkpoint_0.pt" in written, (mode, written)
        assert "COMPLETE" not in written and "accel_checkpoint.json" not in written

        # A new process (this one) resumes from the newest complete checkpoint and trains on.
        config = ProjectConfiguration(project_dir=str(tmp_path / mode), automatic_checkpoint_naming=True)
        accelerator = Accelerator(cpu=True, project_config=config)
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 2))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        restored = {}

        class Tracker:
            def __init__(self, store):
                self.store = store

            def state_dict(self):
                return {"value": self.store.get("value", 0)}

            def load_state_dict(self, state):
                self.store.update(state)

        accelerator.register_for_checkpointing(Tracker(restored))
        accelerator.load_state()
        expected = load_file(str(base / "checkpoint_0" / "model.safetensors"))
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items()), mode
        assert restored == {"value": 2} and scheduler.scheduler.last_epoch == 2
        assert optimizer.state_dict()["state"][0]["step"].item() == 2
        assert accelerator.project_configuration.iteration == 1
        loss = model(torch.randn(4, 8)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        assert accelerator.save_state().endswith("checkpoint_1")
        assert sorted(os.listdir(base)) == ["checkpoint_0", "checkpoint_1"]  # the partial folder was cleaned up
