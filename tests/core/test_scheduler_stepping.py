"""The LR scheduler steps as in Accelerate by default (2 processes, real torchrun), and once per
optimizer step with scheduler_stepping="per_optimizer_step"; see tests/multiprocess/scheduler_checks.py
(one launch; each of its checks is one test here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "scheduler_checks.py"


@pytest.fixture(scope="module")
def scheduler_run(torchrun_checks):
    return torchrun_checks(SCRIPT, timeout=400)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_scheduler_stepping_on_two_processes(scheduler_run, name) -> None:
    scheduler_run.assert_passed(name)
