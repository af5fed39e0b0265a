"""The LR scheduler steps as in Accelerate by default (2 processes, real torchrun), and once per
optimizer step with scheduler_stepping="per_optimizer_step"; see tests/multiprocess/scheduler_checks.py."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "scheduler_checks.py"


@pytest.mark.slow
def test_scheduler_stepping_on_two_processes(torchrun) -> None:
    result = torchrun(SCRIPT, timeout=400)
    assert "SCHEDULER CHECKS PASSED 0" in result.stdout and "SCHEDULER CHECKS PASSED 1" in result.stdout
