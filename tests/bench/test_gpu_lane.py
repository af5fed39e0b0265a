"""bench/gpu_lane.py: a case that fails (here: one that outlives its time limit, as a hung collective does) makes the
lane exit non-zero with the case marked FAIL, and takes its workers down with it: torchrun starts them in sessions
of their own, so killing torchrun alone left them running (checked by hand with a 30 s limit, by which the worker
has started: 1 worker left before, none after; within this test's 3 s torchrun may not have started it yet). A case
that cannot run on the machine is reported as skipped with its reason, and the lane still exits 0. The CPU dry run
that passes is run by hand: about a minute per case (bench/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

LANE = Path(__file__).resolve().parents[2] / "bench" / "gpu_lane.py"


def processes_with(marker: str) -> list[int]:
    """This user's processes whose environment holds `marker` (the lane's workers inherit it)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:  # gone, or another user's
                continue
    return found


def test_a_case_past_its_time_limit_fails_the_lane_and_leaves_no_worker() -> None:
    marker = f"GPU_LANE_TEST={uuid.uuid4().hex}"
    env = {**os.environ, "GPU_LANE_TEST": marker.split("=", 1)[1]}
    command = [sys.executable, str(LANE), "--cpu", "--only", "fp16_grad_scaler", "--timeout", "3"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "| fp16_grad_scaler | 1 | FAIL |" in done.stdout and "timed out after 3 s" in done.stdout, done.stdout
    assert "failed: ['fp16_grad_scaler']" in done.stdout
    time.sleep(1)  # a worker left behind would still be importing torch now
    left = processes_with(marker)
    for pid in left:  # never leave them running, even when the check fails
        os.kill(pid, 9)
    assert not left, f"the lane left {len(left)} worker(s) of the timed-out case running"


def test_a_case_that_cannot_run_here_is_skipped_with_its_reason_and_does_not_fail_the_lane() -> None:
    # Transformer-Engine runs on CUDA only: on the dry run its case raises Skip before importing accel (~20 s).
    command = [sys.executable, str(LANE), "--cpu", "--only", "fp8_transformer_engine"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| fp8_transformer_engine | 1 | skipped |" in done.stdout and "CUDA GPUs only" in done.stdout, done.stdout
    assert "0 passed, 1 skipped, 0 failed" in done.stdout, done.stdout
