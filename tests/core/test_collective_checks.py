"""Mismatched collectives raise the same clear error on both ranks (2 processes, gloo); debug mode
reports a collective called on one rank only (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "collective_checks.py"


@pytest.mark.slow
def test_mismatched_collectives_raise_on_every_rank(torchrun):
    result = torchrun(SCRIPT, "mismatches")
    assert "COLLECTIVE CHECKS PASSED 0" in result.stdout and "COLLECTIVE CHECKS PASSED 1" in result.stdout


@pytest.mark.slow
def test_debug_mode_reports_a_collective_on_one_rank_only(torchrun, tmp_path):
    result = torchrun(SCRIPT, "subset", str(tmp_path), env={"ACCEL_DEBUG_MODE": "1"})
    assert "ok a gather on rank 0 only" in result.stdout and "COLLECTIVE CHECKS PASSED 1" in result.stdout
