"""Mesh-first parallelism for real: one 4-process launch through every layout, then one plain process.

mesh_checks.py (4 processes, gloo): TP2 x FSDP2, HSDP 2 x 2, TP2 x DDP2, TP4 and a 2-D FSDP plugin
mesh each match one process (loss and global grad norm within 1e-5 over 20 steps), peers read the
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

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_layouts_checkpoints_and_errors_on_four_processes_then_one(torchrun, tmp_path):
    result = torchrun(HERE / "mesh_checks.py", str(tmp_path), nproc=4, timeout=900)
    assert all(f"MESH CHECKS PASSED {rank}" in result.stdout for rank in range(4)), result.stdout[-3000:]
    for layout in ("TP2xFSDP2", "HSDP2x2", "TP2xDDP2", "TP4", "FSDP2-plugin-mesh"):
        assert f"LAYOUT {layout}" in result.stdout
    assert result.stdout.count("ERROR ON EVERY RANK") == 8

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
