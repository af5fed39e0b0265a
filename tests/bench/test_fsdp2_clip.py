"""accel's clip of FSDP2's sharded gradients: no to_local() view per gradient, and torch's norm and clipped
gradients (fsdp2_clip_checks.py, one 2-process launch; each check is one test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in

SCRIPT = Path(__file__).resolve().parent / "fsdp2_clip_checks.py"


@pytest.fixture(scope="module")
def clip_run(torchrun_checks) -> CheckRun:
    return torchrun_checks(SCRIPT, timeout=240)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_fsdp2_clip(clip_run: CheckRun, name: str) -> None:
    clip_run.assert_passed(name)
