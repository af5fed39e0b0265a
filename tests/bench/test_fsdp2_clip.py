"""accel's clip of FSDP2's sharded gradients: no to_local() view per gradient, and torch's norm and clipped
gradients (fsdp2_clip_checks.py, run after tests/fsdp/train_checks.py's checks in one 2-process launch; each check
is one test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in

SCRIPT = Path(__file__).resolve().parent / "fsdp2_clip_checks.py"


@pytest.fixture(scope="module")
def clip_run(fsdp_two_process_checks: CheckRun) -> CheckRun:
    """The session's launch of tests/fsdp/two_process_checks.py (tests/conftest.py): tests/fsdp/train_checks.py's
    checks, then this script's."""
    return fsdp_two_process_checks


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_fsdp2_clip(clip_run: CheckRun, name: str) -> None:
    clip_run.assert_passed(name)
