"""Mismatched collectives raise the same clear error on both ranks (2 processes, gloo); debug mode
reports a collective called on one rank only (torch's TORCH_DISTRIBUTED_DEBUG=DETAIL checks). One launch per script;
each of its checks is one test."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

MULTIPROCESS = Path(__file__).resolve().parents[1] / "multiprocess"
SCRIPT = MULTIPROCESS / "collective_checks.py"
SUBSET_SCRIPT = MULTIPROCESS / "collective_subset_checks.py"


@pytest.fixture(scope="module")
def mismatches_run(torchrun_checks):
    return torchrun_checks(SCRIPT)


@pytest.fixture(scope="module")
def subset_run(torchrun_checks, tmp_path_factory):
    return torchrun_checks(SUBSET_SCRIPT, str(tmp_path_factory.mktemp("subset")), env={"ACCEL_DEBUG_MODE": "1"})


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_mismatched_collectives_raise_on_every_rank(mismatches_run, name):
    mismatches_run.assert_passed(name)


@pytest.mark.parametrize("name", checks_in(SUBSET_SCRIPT))
def test_debug_mode_reports_a_collective_on_one_rank_only(subset_run, name):
    subset_run.assert_passed(name)
