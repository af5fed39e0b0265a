"""The single-process bench runs of test_compare.py and test_gpu_mfu.py, started together.

Each is one process on one thread (OMP_NUM_THREADS=1) and the CI machine has 2 cores: run one after the other, one
core stayed idle. Only the runs of the selected tests start; each test waits for its own and asserts on it as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@dataclass
class BenchRun:
    """A finished run and the folder it wrote in."""

    done: subprocess.CompletedProcess[str]
    folder: Path


def _compare(folder: Path) -> BenchRun:
    """bench/compare's accel-only scenarios in one process (test_compare.py)."""
    command = [sys.executable, str(BENCH / "compare" / "worker.py"), "--framework", "accel", "--quick"]
    command += ["--out", str(folder / "out.json"), "--scenarios", "step,loader,gather,checkpoint"]
    command += [f"--arg=dir={folder}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return BenchRun(subprocess.run(command, capture_output=True, text=True, timeout=300, env=env), folder)


def _gpu_mfu(folder: Path) -> BenchRun:
    """bench/gpu_mfu.py's two variants at the tiny size on the CPU (test_gpu_mfu.py)."""
    command = [sys.executable, str(BENCH / "gpu_mfu.py"), "--tiny", "--no-compile", "--rounds", "1", "--steps", "1"]
    env = {**os.environ, "ACCEL_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    return BenchRun(subprocess.run(command, capture_output=True, text=True, timeout=240, env=env), folder)


# The test that reads each run.
RUNS = {
    "test_accel_scenarios_run_in_one_process": _compare,
    "test_both_variants_run_with_the_same_fsdp_settings": _gpu_mfu,
}


@pytest.fixture(scope="session")
def bench_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Test name -> Future of its ``BenchRun``, for the selected tests of ``RUNS``, all started at once."""
    wanted = {item.name for item in request.session.items}
    names = [name for name in RUNS if name in wanted]
    with ThreadPoolExecutor(max_workers=max(len(names), 1), thread_name_prefix="bench") as pool:
        yield {name: pool.submit(RUNS[name], tmp_path_factory.mktemp(RUNS[name].__name__)) for name in names}


@pytest.fixture
def bench_run(bench_runs: dict[str, Future[BenchRun]], request: pytest.FixtureRequest) -> BenchRun:
    """The run of the test asking (a test of ``RUNS``)."""
    return bench_runs[request.node.name].result(timeout=600)
