"""Runs accel-data's 2-process checks (tests/data/mp_data_checks.py) under torchrun with gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "mp_data_checks.py"


@pytest.mark.slow
def test_data_checks_on_two_processes(torchrun):
    result = torchrun(SCRIPT, timeout=240)
    assert "DATA CHECKS PASSED 0" in result.stdout and "DATA CHECKS PASSED 1" in result.stdout, result.stdout
