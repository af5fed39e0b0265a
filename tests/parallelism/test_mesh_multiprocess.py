"""Mesh-first parallelism for real: one 4-process launch through every layout (shared with the pipeline tests), then
one plain process.

mesh_checks.py (4 processes, gloo): TP2 x FSDP2, HSDP 2 x 2, TP2 x DDP2, TP4 and a 2-D FSDP plugin
mesh each match one process (loss and global grad norm within 1e-5 over 10 steps), peers read the
same batches, gather_for_metrics is exact; bad layouts fail on every rank; context parallelism's
mesh and sequence split; a TP2 x FSDP2 checkpoint resumes bit-identically and on FSDP4.
single_process_load.py: that checkpoint on one process without a process group (full weights).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in

HERE = Path(__file__).resolve().parent


# One 4-process launch runs this script's checks, then tests/pipeline/pipeline_checks.py's (tests/conftest.py:
# four_process_layouts).
SCRIPT = HERE / "mesh_checks.py"


@pytest.fixture(scope="module")
def mesh_folder(four_process_layouts: tuple[CheckRun, Path]) -> Path:
    return four_process_layouts[1]


@pytest.fixture(scope="module")
def mesh_run(four_process_layouts: tuple[CheckRun, Path]) -> CheckRun:
    return four_process_layouts[0]


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_layouts_checkpoints_and_errors_on_four_processes(mesh_run: CheckRun, name: str) -> None:
    mesh_run.assert_passed(name)


def test_rank_0_reports_every_layout_and_error(mesh_run: CheckRun) -> None:
    for layout in ("TP2xFSDP2", "HSDP2x2", "TP2xDDP2", "TP4", "FSDP2-plugin-mesh"):
        assert f"LAYOUT {layout}" in mesh_run.stdout
    assert mesh_run.stdout.count("ERROR ON EVERY RANK") == 8


def test_the_checkpoint_loads_on_one_process(mesh_run: CheckRun, mesh_folder: Path) -> None:
    mesh_run.assert_passed("a_tp2_x_fsdp2_checkpoint_resumes_on_the_same_layout_and_on_fsdp4")
    tmp_path = mesh_folder
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    command = [sys.executable, str(HERE / "single_process_load.py"), str(tmp_path)]
    try:
        single = subprocess.run(
            command,
            env={**environ, "ACCEL_USE_CPU": "true", "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"single-process load did not finish within 300s\n{error.stdout}\n{error.stderr}")
    assert single.returncode == 0, f"{single.stdout}\n{single.stderr[-6000:]}"
    assert "SINGLE PROCESS LOAD PASSED" in single.stdout
