"""The DeepSpeed launches that two test folders share (a pytest plugin, loaded by tests/conftest.py).

``deepspeed_ops``: DeepSpeed JIT-compiles two small C++ ops (its shared-memory allreduce, its CPU Adam) into
TORCH_EXTENSIONS_DIR the first time; this builds (or finds) them once, before any timed run. CI keeps that folder
between runs, so the build happens once per checkout path.

``deepspeed_runs``: the 2-process torchrun launch (tests/deepspeed/two_process_checks.py: zero_checks.py's checks,
reshard_checks.py's, then tests/bench/zero3_step_checks.py's run of bench/zero3_step.py) and the plain `python` start
(one_process_checks.py: single_process_checks.py's checks, then reshard_checks.py's), started together. Each start
imports torch and DeepSpeed in every process (seconds of CPU each), so tests/deepspeed and tests/bench/
test_zero3_step.py read one pair of starts instead of starting their own; each script's checks are still the tests of
their own test function.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from checkrun import CheckRun, declared_checks, run_check_script, torchrun_command, worker_env

REPO = Path(__file__).resolve().parents[2]
DEEPSPEED_TESTS = REPO / "tests" / "deepspeed"
ZERO_SCRIPT = DEEPSPEED_TESTS / "zero_checks.py"
SINGLE_PROCESS_SCRIPT = DEEPSPEED_TESTS / "single_process_checks.py"
RESHARD_SCRIPT = DEEPSPEED_TESTS / "reshard_checks.py"
ZERO3_STEP_SCRIPT = REPO / "tests" / "bench" / "zero3_step_checks.py"
# The two starts that run those scripts' checks, in this order (the drivers import them so).
TWO_PROCESS_DRIVER = DEEPSPEED_TESTS / "two_process_checks.py"
ONE_PROCESS_DRIVER = DEEPSPEED_TESTS / "one_process_checks.py"
LAUNCHED = {2: (ZERO_SCRIPT, RESHARD_SCRIPT, ZERO3_STEP_SCRIPT), 1: (SINGLE_PROCESS_SCRIPT, RESHARD_SCRIPT)}

# DeepSpeed's accelerator on CPU, added to the harness's worker environment (tests/harness/checkrun.py).
DEEPSPEED_CPU = {"DS_ACCELERATOR": "cpu"}
RUN_TIMEOUT = 420  # seconds for one launch once the ops are compiled (about 70 s on 2 busy cores)

_BUILD_OPS = """
from accel_deepspeed._deepspeed import import_deepspeed
from accel_deepspeed.ops import CPU_ADAM, SHM_COMM, load_op
import_deepspeed()
for name in (SHM_COMM, CPU_ADAM):
    load_op(name)  # accel's build: announced, and safe from a lock left by a killed build
print("OPS READY")
"""


@pytest.fixture(scope="session")
def deepspeed_ops() -> None:
    """Compiles (or finds in TORCH_EXTENSIONS_DIR) DeepSpeed's CPU ops before any timed run."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", _BUILD_OPS],
            env=worker_env(DEEPSPEED_CPU),
            capture_output=True,
            text=True,
            timeout=1200,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("Compiling DeepSpeed's CPU ops took over 20 minutes")
    assert "OPS READY" in result.stdout, result.stderr[-4000:]


@dataclass
class DeepSpeedRuns:
    """The two starts' records, by process count, and the folder both wrote in (checkpoints, bench report)."""

    runs: dict[int, CheckRun]
    folder: Path


@pytest.fixture(scope="session")
def deepspeed_runs(deepspeed_ops: None, tmp_path_factory: pytest.TempPathFactory) -> DeepSpeedRuns:
    """The 2-process torchrun launch and the plain `python` start, started together: each runs its own checks, then
    they load each other's checkpoints (2 processes -> 1 and 1 -> 2); the 2-process one then runs the ZeRO-3 bench
    step."""
    folder = tmp_path_factory.mktemp("deepspeed")
    commands = {
        2: (torchrun_command(TWO_PROCESS_DRIVER, str(folder), nproc=2), TWO_PROCESS_DRIVER),
        1: ([sys.executable, str(ONE_PROCESS_DRIVER), str(folder)], ONE_PROCESS_DRIVER),
    }
    # The harness checks that each start ran exactly these checks. Parsed here, before the threads: CPython 3.11's
    # `ast.parse` is not thread-safe (two at once in CI raised "SystemError: AST constructor recursion depth
    # mismatch", and the 2-process launch then waited out its timeout for the other).
    names = {
        nproc: [name for script in scripts for name in declared_checks(script)] for nproc, scripts in LAUNCHED.items()
    }
    results = {nproc: tmp_path_factory.mktemp(f"deepspeed_results_{nproc}") for nproc in commands}

    def run(nproc: int) -> CheckRun:
        command, driver = commands[nproc]
        return run_check_script(
            command,
            driver,
            nproc=nproc,
            env=DEEPSPEED_CPU,
            timeout=RUN_TIMEOUT,
            results=results[nproc],
            names=names[nproc],
        )

    with ThreadPoolExecutor(2) as pool:
        return DeepSpeedRuns(dict(zip((2, 1), pool.map(run, (2, 1)), strict=True)), folder)
