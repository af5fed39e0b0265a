"""Shared test helpers: launching a script under torchrun with a timeout, so a hang fails the test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(
    script: str | Path,
    *args: str,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` on ``nproc`` CPU processes (gloo) with torch.distributed.run; fails on timeout."""
    command = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
        str(script), *args,
    ]
    full_env = {**os.environ, "ACCEL_USE_CPU": "true", "OMP_NUM_THREADS": "1", **(env or {})}
    try:
        result = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{script} did not finish within {timeout}s (a hang?)\nstdout:\n{error.stdout}\nstderr:\n{error.stderr}")
    if check and result.returncode != 0:
        pytest.fail(f"{script} failed with exit code {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}")
    return result


@pytest.fixture
def torchrun() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_torchrun
