"""Runs accel-data's 2-process checks (tests/data/mp_data_checks.py) under torchrun with gloo: one launch, each of its
checks one test."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

SCRIPT = Path(__file__).resolve().parent / "mp_data_checks.py"


@pytest.fixture(scope="module")
def data_run(torchrun_checks):
    return torchrun_checks(SCRIPT, timeout=240)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_data_checks_on_two_processes(data_run, name):
    data_run.assert_passed(name)
