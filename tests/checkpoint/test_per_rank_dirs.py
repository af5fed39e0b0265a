"""Two processes (gloo, CPU), each checkpointing into its own folder (no shared file system needed).

One launch of mp_per_rank_dirs.py; each of its checks is one test here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

SCRIPT = Path(__file__).resolve().parent / "mp_per_rank_dirs.py"


@pytest.fixture(scope="module")
def per_rank_run(torchrun_checks, tmp_path_factory):
    return torchrun_checks(SCRIPT, str(tmp_path_factory.mktemp("per_rank")), timeout=300)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_each_process_reads_back_its_own_folder(per_rank_run, name):
    per_rank_run.assert_passed(name)
