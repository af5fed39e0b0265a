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
from checkrun import CheckRun, checks_in, declared_checks, run_check_script, torchrun_command

pytestmark = pytest.mark.slow  # every test here launches DeepSpeed (tens of seconds each)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# DeepSpeed's accelerator on CPU, added to the harness's worker environment (tests/harness/checkrun.py).
DEEPSPEED_CPU = {"DS_ACCELERATOR": "cpu"}
RUN_TIMEOUT = 420  # seconds for one launch once the ops are compiled (about 60 s on 2 busy cores)


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
# The two launches that run those scripts' checks (all but the offload script's: `accel launch` sets its own options).
TWO_PROCESS_DRIVER = HERE / "two_process_checks.py"
ONE_PROCESS_DRIVER = HERE / "one_process_checks.py"


@pytest.fixture(scope="module")
def deepspeed_runs(deepspeed_ops, tmp_path_factory) -> dict[int, CheckRun]:
    """The 2-process torchrun launch (two_process_checks.py: zero_checks.py's checks, then reshard_checks.py's) and
    the plain `python` start (one_process_checks.py: single_process_checks.py's, then reshard_checks.py's), started
    together: each runs its own checks, then they load each other's checkpoints (2 processes -> 1 and 1 -> 2).

    Two starts instead of four (each start imports torch and DeepSpeed in every process); each script's checks are
    still the tests of their own test function below."""
    folder = str(tmp_path_factory.mktemp("deepspeed"))
    launches = {
        2: (torchrun_command(TWO_PROCESS_DRIVER, folder, nproc=2), TWO_PROCESS_DRIVER, ZERO_SCRIPT),
        1: ([sys.executable, str(ONE_PROCESS_DRIVER), folder], ONE_PROCESS_DRIVER, SINGLE_PROCESS_SCRIPT),
    }

    # The driver imports the scripts in this order; the harness checks that the launch ran exactly these. Parsed
    # here, before the threads: CPython 3.11's `ast.parse` is not thread-safe (two at once in CI raised "SystemError:
    # AST constructor recursion depth mismatch", and the 2-process launch then waited out its timeout for the other).
    names = {
        nproc: [*declared_checks(first), *declared_checks(RESHARD_SCRIPT)] for nproc, (_, _, first) in launches.items()
    }
    results = {nproc: tmp_path_factory.mktemp(f"results_{nproc}") for nproc in launches}

    def run(nproc: int) -> CheckRun:
        command, driver, _ = launches[nproc]
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
        return dict(zip((2, 1), pool.map(run, (2, 1)), strict=True))


@pytest.fixture(scope="module")
def zero_run(deepspeed_runs: dict[int, CheckRun]) -> CheckRun:
    """ZeRO-1, ZeRO-2 (accumulation + clipping), ZeRO-3 (+ zero.Init, consolidated weights) and bf16 vs DDP."""
    return deepspeed_runs[2]


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
def single_process_run(deepspeed_runs: dict[int, CheckRun]) -> CheckRun:
    """Plain `python train.py`: contradictory-config errors, DummyOptim/DummyScheduler, frozen teacher + ZeRO-3
    resume."""
    return deepspeed_runs[1]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", checks_in(SINGLE_PROCESS_SCRIPT))
def test_single_process_errors_dummies_teacher(single_process_run: CheckRun, name: str) -> None:
    single_process_run.assert_passed(name)


@pytest.fixture(scope="module")
def reshard_runs(deepspeed_runs: dict[int, CheckRun]) -> dict[int, CheckRun]:
    """ZeRO-1/2/3 (+ optimizer offload) checkpoints: 2 processes -> 1 and 1 -> 2 through universal checkpoints."""
    return deepspeed_runs


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
