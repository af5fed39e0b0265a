"""Two processes (gloo, CPU): exact resume, failures shared by all processes, state hooks, sharded (DCP) state."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "mp_checkpoint.py"


@pytest.mark.slow
def test_two_processes_resume_exactly_and_share_failures(tmp_path, torchrun):
    first = torchrun(SCRIPT, "full", str(tmp_path), timeout=300)
    assert first.stdout.count("full run OK") == 2
    second = torchrun(SCRIPT, "resume", str(tmp_path), timeout=300)
    for check in (
        "exact resume OK",
        "failure on one process fails all OK",
        "data changed refused OK",
        "state hooks get the user's modules OK",
        "sharded checkpoints OK",
    ):
        assert second.stdout.count(check) == 2, second.stdout

    # The same checkpoint in one process: weights load, and the dataloader position saved by two
    # processes (6 steps of 2 batches) becomes 12 steps of this single process.
    sys.path.insert(0, str(HERE))
    try:
        import mp_checkpoint
    finally:
        sys.path.remove(str(HERE))
    accelerator, model, _optimizer, loader, _scheduler = mp_checkpoint.build(str(tmp_path))
    accelerator.load_state(str(tmp_path / "step_k"))
    expected = load_file(str(tmp_path / "step_k" / "model.safetensors"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())  # one process: no DDP wrapper
    assert loader.state_dict()["batches_yielded"] == 2 * mp_checkpoint.K
    assert accelerator.step == mp_checkpoint.K
