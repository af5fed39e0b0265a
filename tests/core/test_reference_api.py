"""Accelerator API of the reference that scripts use, checked on 2 processes under torchrun (gloo):
see tests/multiprocess/reference_api_checks.py for the list (one launch; each of its checks is one test here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "reference_api_checks.py"


@pytest.fixture(scope="module")
def reference_api_run(torchrun_checks, tmp_path_factory):
    return torchrun_checks(SCRIPT, str(tmp_path_factory.mktemp("reference_api")), timeout=600)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_reference_api_on_two_processes(reference_api_run, name) -> None:
    reference_api_run.assert_passed(name)
