"""Real DeepSpeed runs on CPU with gloo: 2-process torchrun / `accel launch`, and a plain `python` start.

DeepSpeed JIT-compiles two small C++ ops (its shared-memory allreduce, its CPU Adam) into
TORCH_EXTENSIONS_DIR the first time; the session fixture builds them once, with a long timeout,
so every run after it uses the cache (CI keeps that folder between runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here launches DeepSpeed (tens of seconds each)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUN_TIMEOUT = 300  # seconds for one launch once the ops are compiled (about 45 s on 2 busy cores)


def _env() -> dict[str, str]:
    return {**os.environ, "ACCEL_USE_CPU": "true", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def _figures(output: str) -> dict:
    start = output.find("FIGURES ")
    if start < 0:
        return {}
    # Only the JSON object: the other rank may print on the same line.
    return json.JSONDecoder().raw_decode(output[start + len("FIGURES ") :])[0]


def test_zero_stages_follow_ddp(deepspeed_ops, torchrun, tmp_path) -> None:
    """ZeRO-1, ZeRO-2 (accumulation + clipping), ZeRO-3 (+ zero.Init, consolidated weights) and bf16 vs DDP."""
    result = torchrun(HERE / "zero_checks.py", str(tmp_path), env={"DS_ACCELERATOR": "cpu"}, timeout=RUN_TIMEOUT)
    for rank in (0, 1):
        assert f"ZERO CHECKS PASSED {rank}" in result.stdout, result.stdout + result.stderr[-4000:]
    figures = _figures(result.stdout)
    print(figures)
    assert figures["zero1_max_rel_diff"] < 1e-4 and figures["zero3_consolidated_max_abs_diff"] < 1e-4
    assert 0 < figures["bf16_max_rel_diff"] < 5e-2, "bf16 must differ a little from fp32, not be it"


@pytest.mark.multiprocess
def test_offload_and_checkpoint_through_accel_launch(deepspeed_ops, tmp_path) -> None:
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
        str(tmp_path),
    ]
    try:
        result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=REPO)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"accel launch did not finish within {RUN_TIMEOUT}s (a hang?)\n{error.stdout}\n{error.stderr}")
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    for rank in (0, 1):
        assert f"OFFLOAD CHECKPOINT CHECKS PASSED {rank}" in result.stdout
    print(_figures(result.stdout))


def test_single_process_errors_dummies_teacher(deepspeed_ops, tmp_path) -> None:
    """Plain `python train.py`: contradictory-config errors, DummyOptim/DummyScheduler, frozen teacher + ZeRO-3
    resume."""
    try:
        result = subprocess.run(
            [sys.executable, str(HERE / "single_process_checks.py"), str(tmp_path)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"single_process_checks.py did not finish within {RUN_TIMEOUT}s\n{error.stdout}\n{error.stderr}")
    assert result.returncode == 0 and "SINGLE PROCESS CHECKS PASSED" in result.stdout, (
        result.stdout + result.stderr[-6000:]
    )


@pytest.mark.multiprocess
def test_checkpoints_load_with_another_process_count(deepspeed_ops, tmp_path) -> None:
    """ZeRO-1/2/3 (+ optimizer offload) checkpoints: 2 processes -> 1 and 1 -> 2 through universal checkpoints.

    The 2-process and the 1-process launch run at the same time and wait for each other's checkpoints.
    """
    script = str(HERE / "reshard_checks.py")
    commands = [
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script, str(tmp_path)],
        [sys.executable, script, str(tmp_path)],
    ]
    launches = [
        subprocess.Popen(c, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        for c in commands
    ]
    outputs = []
    for launch in launches:
        try:
            outputs.append(launch.communicate(timeout=RUN_TIMEOUT))
        except subprocess.TimeoutExpired:
            for other in launches:
                other.kill()
            pytest.fail(
                f"reshard_checks.py did not finish within {RUN_TIMEOUT}s (a hang?)\n"
                + "\n".join(o for pair in outputs for o in pair)
            )
    for launch, (stdout, stderr), passed in zip(launches, outputs, (("0", "1"), ("0",)), strict=True):
        assert launch.returncode == 0, stdout + stderr[-6000:]
        for rank in passed:
            assert f"RESHARD CHECKS PASSED {rank}" in stdout, stdout + stderr[-4000:]
        figures = _figures(stdout)
        print(figures)
        assert all(v < 1e-5 for k, v in figures.items() if k.endswith("_weights")), figures
