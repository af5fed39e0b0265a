"""Shared test helpers: launching a script under torchrun with a timeout, so a hang fails the test.

Markers (registered in the root pyproject.toml): a test that uses the ``torchrun`` fixture is marked
``multiprocess`` and ``slow`` here (each launch imports torch in every process: seconds of CPU); ``slow`` for other
tests (another process that imports torch, or over ~3 s on the 2-core CI machine) and ``gpu`` are set by hand.
The fast lane, ``-m "not slow"``, stays under 5 minutes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def rendezvous_args() -> list[str]:
    """torchrun options for a job on this host whose port torchrun picks and holds itself.

    A c10d rendezvous on port 0 binds a free port and keeps it (as ``--standalone`` does), where
    picking a free port here and releasing it for torchrun left a window for another job to take
    it. ``--local-addr`` keeps the workers on the loopback address instead of the host's FQDN.
    """
    return ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1", f"--rdzv-id={uuid.uuid4()}"]


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
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        *rendezvous_args(),
        str(script),
        *args,
    ]
    full_env = {**os.environ, "ACCEL_USE_CPU": "true", "OMP_NUM_THREADS": "1", **(env or {})}
    try:
        result = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as error:
        pytest.fail(
            f"{script} did not finish within {timeout}s (a hang?)\nstdout:\n{error.stdout}\nstderr:\n{error.stderr}"
        )
    if check and result.returncode != 0:
        pytest.fail(
            f"{script} failed with exit code "
            f"{result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
        )
    return result


@pytest.fixture(scope="session")
def torchrun() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_torchrun``; session-scoped, so a module-scoped fixture can launch once for several tests."""
    return run_torchrun


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # fixturenames includes the fixtures a test uses through other fixtures.
        if "torchrun" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.multiprocess)
            item.add_marker(pytest.mark.slow)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_tests:
        import torch  # only when a gpu test was collected: collection stays free of torch otherwise

        if not torch.cuda.is_available():
            for item in gpu_tests:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
