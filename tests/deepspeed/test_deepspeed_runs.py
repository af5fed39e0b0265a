"""Real DeepSpeed runs on CPU with gloo: 2-process torchrun / `accel launch`, and a plain `python` start.

DeepSpeed JIT-compiles two small C++ ops (its shared-memory allreduce, its CPU Adam) into
TORCH_EXTENSIONS_DIR the first time; the session fixture builds them once, with a long timeout,
so every run after it uses the cache (CI keeps that folder between runs).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in, run_check_script, torchrun_command

pytestmark = pytest.mark.slow  # every test here launches DeepSpeed (tens of seconds each)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# DeepSpeed's accelerator on CPU, added to the harness's worker environment (tests/harness/checkrun.py).
DEEPSPEED_CPU = {"DS_ACCELERATOR": "cpu"}
RUN_TIMEOUT = 300  # seconds for one launch once the ops are compiled (about 45 s on 2 busy cores)


def _figures(output: str) -> dict:
    start = output.find("FIGURES ")
    if start < 0:
        return {}
    # Only the JSON object: the other rank may print on the same line.
    return json.JSONDecoder().raw_decode(output[start + len("FIGURES ") :])[0]


ZERO_SCRIPT = HERE / "zero_checks.py"
OFFLOAD_SCRIPT = HERE / "offload_checkpoint_checks.py"
SINGLE_PROCESS_SCRIPT = HERE / "single_process_checks.py"
RESHARD_SCRIPT = HERE / "reshard_checks.py"


@pytest.fixture(scope="module")
def zero_run(deepspeed_ops, torchrun_checks, tmp_path_factory) -> CheckRun:
    """ZeRO-1, ZeRO-2 (accumulation + clipping), ZeRO-3 (+ zero.Init, consolidated weights) and bf16 vs DDP."""
    return torchrun_checks(ZERO_SCRIPT, str(tmp_path_factory.mktemp("zero")), env=DEEPSPEED_CPU, timeout=RUN_TIMEOUT)


@pytest.mark.parametrize("name", checks_in(ZERO_SCRIPT))
def test_zero_stages_follow_ddp(zero_run: CheckRun, name: str) -> None:
    zero_run.assert_passed(name)


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
def single_process_run(deepspeed_ops, tmp_path_factory) -> CheckRun:
    """Plain `python train.py`: contradictory-config errors, DummyOptim/DummyScheduler, frozen teacher + ZeRO-3
    resume."""
    command = [sys.executable, str(SINGLE_PROCESS_SCRIPT), str(tmp_path_factory.mktemp("single"))]
    results = tmp_path_factory.mktemp("single_results")
    return run_check_script(
        command, SINGLE_PROCESS_SCRIPT, nproc=1, env=DEEPSPEED_CPU, timeout=RUN_TIMEOUT, results=results
    )


@pytest.mark.parametrize("name", checks_in(SINGLE_PROCESS_SCRIPT))
def test_single_process_errors_dummies_teacher(single_process_run: CheckRun, name: str) -> None:
    single_process_run.assert_passed(name)


@pytest.fixture(scope="module")
def reshard_runs(deepspeed_ops, tmp_path_factory) -> dict[int, CheckRun]:
    """ZeRO-1/2/3 (+ optimizer offload) checkpoints: 2 processes -> 1 and 1 -> 2 through universal checkpoints.

    The 2-process and the 1-process launch run at the same time and wait for each other's checkpoints."""
    folder = str(tmp_path_factory.mktemp("reshard"))
    commands = {2: torchrun_command(RESHARD_SCRIPT, folder, nproc=2), 1: [sys.executable, str(RESHARD_SCRIPT), folder]}

    def run(nproc: int) -> CheckRun:
        results = tmp_path_factory.mktemp(f"reshard_results_{nproc}")
        return run_check_script(
            commands[nproc], RESHARD_SCRIPT, nproc=nproc, env=DEEPSPEED_CPU, timeout=RUN_TIMEOUT, results=results
        )

    with ThreadPoolExecutor(2) as pool:
        return dict(zip((2, 1), pool.map(run, (2, 1)), strict=True))


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
