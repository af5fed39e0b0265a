"""Two processes (gloo, CPU), each checkpointing into its own folder (no shared file system needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "mp_per_rank_dirs.py"


@pytest.mark.slow
def test_each_process_reads_back_its_own_folder(tmp_path, torchrun):
    result = torchrun(SCRIPT, str(tmp_path), timeout=300, check=False)
    assert "PER-RANK CHECKS PASSED 0" in result.stdout and "PER-RANK CHECKS PASSED 1" in result.stdout, (
        result.stdout + result.stderr[-3000:]
    )
