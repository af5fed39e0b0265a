"""accel-fsdp for real: 2 CPU processes (gloo) under torchrun, then 1 process started by ``accel launch``.

train_checks.py: FSDP2 and FSDP1 follow plain DDP's loss trajectory and clip norms (with an
optimizer and scheduler built before prepare), hold half the parameter / gradient / optimizer
bytes, accumulate gradients without reducing them on micro-steps, keep ``generate`` working,
materialise meta-device models shard by shard, and handle bf16 / fp16 / activation checkpointing;
`accel estimate-memory` on the same model gives the bytes each held with DDP and FSDP2.

checkpoint_checks.py + single_process_checks.py: sharded save -> load gives identical outputs and
an identical continuation; FULL_STATE_DICT and FSDP1 round-trip too; save_model's file loads into a
plain module; `accel merge-weights` merges the sharded checkpoint into a file a plain module loads; the
2-process checkpoint loads on 1 process and training continues on the same path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in, run_check_script

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


TRAIN_SCRIPT = HERE / "train_checks.py"
CHECKPOINT_SCRIPT = HERE / "checkpoint_checks.py"
SINGLE_PROCESS_SCRIPT = HERE / "single_process_checks.py"


@pytest.fixture(scope="module")
def train_run(fsdp_two_process_checks: CheckRun) -> CheckRun:
    """train_checks.py's checks: the session's launch of two_process_checks.py (tests/conftest.py), which runs
    tests/bench/fsdp2_clip_checks.py's after them."""
    return fsdp_two_process_checks


@pytest.mark.parametrize("name", checks_in(TRAIN_SCRIPT))
def test_training_matches_ddp_on_two_processes(train_run: CheckRun, name: str) -> None:
    train_run.assert_passed(name)


def test_estimate_memory_gives_the_bytes_each_process_held(train_run: CheckRun) -> None:
    # `accel estimate-memory` on the same model gives the bytes the largest process held, for DDP and FSDP2.
    # raw_decode, every report of a line: under `python -u` a rank's print writes the text and its newline apart,
    # so the other rank's report can follow on the same line.
    train_run.assert_passed("fsdp2_follows_ddp")  # the check that prints the bytes held
    held = [
        json.JSONDecoder().raw_decode(part)[0]
        for line in train_run.stdout.splitlines()
        for part in line.split("HELD BYTES ")[1:]
    ]
    assert sorted(h["rank"] for h in held) == [0, 1], train_run.stdout[-3000:]
    command = [str(Path(sys.executable).with_name("accel")), "estimate-memory", f"{HERE / 'fsdp_testlib.py'}:Net"]
    command += ["-n", "2", "--strategies", "ddp", "fsdp", "--dtypes", "float32", "--json"]
    estimated = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert estimated.returncode == 0, estimated.stderr
    rows = {row["strategy"]: row for row in map(json.loads, estimated.stdout.splitlines())}
    for strategy in ("ddp", "fsdp"):
        for key in ("parameters", "gradients", "optimizer_state"):
            largest = max(h[strategy][key] for h in held)
            assert rows[strategy][key] == largest, (strategy, key, rows[strategy], [h[strategy] for h in held])
    assert rows["fsdp"]["parameters"] * 2 == rows["ddp"]["parameters"]  # the sharding was engaged


@pytest.fixture(scope="module")
def checkpoint_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fsdp_checkpoints")


@pytest.fixture(scope="module")
def checkpoint_run(torchrun_checks, checkpoint_folder: Path) -> CheckRun:
    # The same LR schedule on 2 processes and on 1 (the default steps it once per process per optimizer step):
    # the continuation on one process is compared with the two-process one.
    env = {
        "ACCEL_STRATEGY": "fsdp",
        "ACCEL_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP": "Block",
        "ACCEL_SCHEDULER_STEPPING": "per_optimizer_step",
    }
    return torchrun_checks(CHECKPOINT_SCRIPT, str(checkpoint_folder), env=env, timeout=300)


@pytest.mark.parametrize("name", checks_in(CHECKPOINT_SCRIPT))
def test_sharded_checkpoints_on_two_processes(checkpoint_run: CheckRun, name: str) -> None:
    checkpoint_run.assert_passed(name)


@pytest.fixture(scope="module")
def single_process_run(
    checkpoint_run: CheckRun, checkpoint_folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> CheckRun:
    """`accel merge-weights`, then single_process_checks.py on one process, on what the 2-process run wrote."""
    for name in checkpoint_run.names:
        checkpoint_run.assert_passed(name)
    tmp_path = checkpoint_folder
    accel = Path(sys.executable).with_name("accel")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    # `accel merge-weights` on the 2-process sharded checkpoint: single_process_checks.py loads the file it writes.
    merged = subprocess.run(
        [str(accel), "merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "cli_merged.safetensors")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert merged.returncode == 0, f"{merged.stdout}\n{merged.stderr}"
    assert f"wrote {tmp_path / 'cli_merged.safetensors'}" in merged.stdout

    # One process, through the real launcher and its --use-fsdp flags (no torchrun, no RANK/WORLD_SIZE).
    command = [
        str(accel),
        "launch",
        "--cpu",
        "-n",
        "1",
        "--use-fsdp",
        "--fsdp-transformer-layer-cls-to-wrap",
        "Block",
        "--scheduler-stepping",
        "per_optimizer_step",
        str(SINGLE_PROCESS_SCRIPT),
        str(tmp_path),
    ]
    results = tmp_path_factory.mktemp("single_process_results")
    return run_check_script(command, SINGLE_PROCESS_SCRIPT, nproc=1, timeout=180, results=results, base_env=environ)


@pytest.mark.parametrize("name", checks_in(SINGLE_PROCESS_SCRIPT))
def test_the_two_process_checkpoint_on_one_process(single_process_run: CheckRun, name: str) -> None:
    single_process_run.assert_passed(name)
