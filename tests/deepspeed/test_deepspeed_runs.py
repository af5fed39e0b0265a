"""Real DeepSpeed runs on CPU with gloo: 2-process torchrun / `accel launch`, and a plain `python` start.

DeepSpeed JIT-compiles two small C++ ops (its shared-memory allreduce, its CPU Adam) into
TORCH_EXTENSIONS_DIR the first time; the session fixture builds them once, with a long timeout,
so every run after it uses the cache (CI keeps that folder between runs). That fixture and the session's
torchrun + `python` launch are tests/harness/deepspeed_launch.py's (tests/bench/test_zero3_step.py reads the launch
too).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in, run_check_script
from deepspeed_launch import (
    DEEPSPEED_CPU,
    RESHARD_SCRIPT,
    RUN_TIMEOUT,
    SINGLE_PROCESS_SCRIPT,
    ZERO_SCRIPT,
    DeepSpeedRuns,
)

pytestmark = pytest.mark.slow  # every test here launches DeepSpeed (tens of seconds each)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _figures(output: str) -> dict:
    start = output.find("FIGURES ")
    if start < 0:
        return {}
    # Only the JSON object: the other rank may print on the same line.
    return json.JSONDecoder().raw_decode(output[start + len("FIGURES ") :])[0]


OFFLOAD_SCRIPT = HERE / "offload_checkpoint_checks.py"


@pytest.fixture(scope="module")
def zero_run(deepspeed_runs: DeepSpeedRuns) -> CheckRun:
    """ZeRO-1, ZeRO-2 (accumulation + clipping), ZeRO-3 (+ zero.Init, consolidated weights) and bf16 vs DDP: the
    2-process launch of the session (tests/harness/deepspeed_launch.py), shared with tests/bench/test_zero3_step.py."""
    return deepspeed_runs.runs[2]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", checks_in(ZERO_SCRIPT))
def test_zero_stages_follow_ddp(zero_run: CheckRun, name: str) -> None:
    zero_run.assert_passed(name)


@pytest.mark.multiprocess
def test_zero_figures(zero_run: CheckRun) -> None:
    figures = _figures(zero_run.stdout)
    print(figures)
    assert figures["zero1_max_rel_diff"] < 1e-4 and figures["zero3_consolidated_max_abs_diff"] < 1e-4
    assert 0 < figures["bf16_max_rel_diff"] < 5e-2, "bf16 must differ a little from fp32, not be it"


@pytest.fixture(scope="module")
def offload_run(deepspeed_ops, tmp_path_factory) -> CheckRun:
    """`accel launch --use-deepspeed ...`: optimizer offload vs DDP, save_state/load_state continuation, unsafe files
    refused."""
    command = [
        sys.executable,
        "-c",
        "import sys; from accel.cli import main; sys.exit(main())",
        "launch",
        "--cpu",
        "-n",
        "2",
        "--use-deepspeed",
        "--zero-stage",
        "2",
        "--offload-optimizer-device",
        "cpu",
        "--gradient-clipping",
        "1.0",
        # The DDP reference steps its scheduler once per optimizer step: accel's option does the same.
        "--scheduler-stepping",
        "per_optimizer_step",
        str(HERE / "offload_checkpoint_checks.py"),
        str(tmp_path_factory.mktemp("offload")),
    ]
    results = tmp_path_factory.mktemp("offload_results")
    run = run_check_script(command, OFFLOAD_SCRIPT, nproc=2, env=DEEPSPEED_CPU, timeout=RUN_TIMEOUT, results=results)
    print(_figures(run.stdout))
    return run


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", checks_in(OFFLOAD_SCRIPT))
def test_offload_and_checkpoint_through_accel_launch(offload_run: CheckRun, name: str) -> None:
    offload_run.assert_passed(name)


@pytest.fixture(scope="module")
def single_process_run(deepspeed_runs: DeepSpeedRuns) -> CheckRun:
    """Plain `python train.py`: contradictory-config errors, DummyOptim/DummyScheduler, frozen teacher + ZeRO-3
    resume (started with the 2-process launch)."""
    return deepspeed_runs.runs[1]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", checks_in(SINGLE_PROCESS_SCRIPT))
def test_single_process_errors_dummies_teacher(single_process_run: CheckRun, name: str) -> None:
    single_process_run.assert_passed(name)


@pytest.fixture(scope="module")
def reshard_runs(deepspeed_runs: DeepSpeedRuns) -> dict[int, CheckRun]:
    """ZeRO-1/2/3 (+ optimizer offload) checkpoints: 2 processes -> 1 and 1 -> 2 through universal checkpoints."""
    return deepspeed_runs.runs


@pytest.mark.multiprocess
@pytest.mark.parametrize("nproc", [2, 1], ids=["2_processes", "1_process"])
@pytest.mark.parametrize("name", checks_in(RESHARD_SCRIPT))
def test_checkpoints_load_with_another_process_count(reshard_runs: dict[int, CheckRun], nproc: int, name: str) -> None:
    reshard_runs[nproc].assert_passed(name)


@pytest.mark.multiprocess
def test_resharded_weights_match(reshard_runs: dict[int, CheckRun]) -> None:
    for run in reshard_runs.values():
        figures = _figures(run.stdout)
        print(figures)
        assert any(k.endswith("_weights") for k in figures), run.stdout[-3000:]
        assert all(v < 1e-5 for k, v in figures.items() if k.endswith("_weights")), figures
