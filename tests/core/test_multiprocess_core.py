"""Runs the 2-process accel-core checks (collectives, process control, RNG sync,
DDP training parity with accumulation, bf16/fp16, join_uneven_inputs) under torchrun with gloo: one launch, each of
the script's checks one test."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "core_checks.py"


@pytest.fixture(scope="module")
def core_run(torchrun_checks, tmp_path_factory):
    return torchrun_checks(SCRIPT, str(tmp_path_factory.mktemp("core")))


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_core_checks_on_two_processes(core_run, name):
    core_run.assert_passed(name)
