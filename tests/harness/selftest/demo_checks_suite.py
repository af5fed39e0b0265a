"""A check script's test module in the shape CONTRIBUTING.md teaches, pointed at the harness's demo script.

Not collected by the suite (its name matches neither ``test_*.py`` nor ``*_test.py``): tests/harness/test_harness.py
runs pytest on it in a subprocess and reads which tests passed and failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

SCRIPT = Path(__file__).resolve().parent / "demo_checks.py"


@pytest.fixture(scope="module")
def checks_run(torchrun_checks):
    return torchrun_checks(SCRIPT, timeout=120)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_check(checks_run, name):
    checks_run.assert_passed(name)
