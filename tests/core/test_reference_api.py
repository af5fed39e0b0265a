"""Accelerator API of the reference that scripts use, checked on 2 processes under torchrun (gloo):
see tests/multiprocess/reference_api_checks.py for the list."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "reference_api_checks.py"


@pytest.mark.slow
def test_reference_api_on_two_processes(torchrun, tmp_path) -> None:
    result = torchrun(SCRIPT, str(tmp_path), timeout=600)
    assert "REFERENCE API CHECKS PASSED 0" in result.stdout and "REFERENCE API CHECKS PASSED 1" in result.stdout
