"""Runs the 2-process accel-core checks (collectives, process control, RNG sync,
DDP training parity with accumulation, bf16/fp16, join_uneven_inputs) under torchrun with gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "core_checks.py"


@pytest.mark.slow
def test_core_checks_on_two_processes(torchrun, tmp_path):
    result = torchrun(SCRIPT, str(tmp_path))
    assert "CORE CHECKS PASSED 0" in result.stdout and "CORE CHECKS PASSED 1" in result.stdout
