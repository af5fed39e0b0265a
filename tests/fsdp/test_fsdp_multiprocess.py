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

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def test_training_matches_ddp_on_two_processes(torchrun):
    result = torchrun(HERE / "train_checks.py", timeout=300)
    assert "FSDP TRAIN CHECKS PASSED 0" in result.stdout and "FSDP TRAIN CHECKS PASSED 1" in result.stdout

    # `accel estimate-memory` on the same model gives the bytes the largest process held, for DDP and FSDP2.
    # raw_decode, every report of a line: under `python -u` a rank's print writes the text and its newline apart,
    # so the other rank's report can follow on the same line.
    held = [
        json.JSONDecoder().raw_decode(part)[0]
        for line in result.stdout.splitlines()
        for part in line.split("HELD BYTES ")[1:]
    ]
    assert sorted(h["rank"] for h in held) == [0, 1], result.stdout[-3000:]
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


def test_sharded_checkpoints_two_processes_then_one(torchrun, tmp_path):
    # The same LR schedule on 2 processes and on 1 (the default steps it once per process per optimizer step):
    # the continuation on one process is compared with the two-process one.
    env = {
        "ACCEL_STRATEGY": "fsdp",
        "ACCEL_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP": "Block",
        "ACCEL_SCHEDULER_STEPPING": "per_optimizer_step",
    }
    result = torchrun(HERE / "checkpoint_checks.py", str(tmp_path), env=env, timeout=300)
    assert "FSDP CHECKPOINT CHECKS PASSED 0" in result.stdout and "FSDP CHECKPOINT CHECKS PASSED 1" in result.stdout

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
        str(HERE / "single_process_checks.py"),
        str(tmp_path),
    ]
    try:
        single = subprocess.run(
            command, env={**environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"single-process run did not finish within 180s\n{error.stdout}\n{error.stderr}")
    assert single.returncode == 0, f"{single.stdout}\n{single.stderr[-6000:]}"
    assert "FSDP SINGLE PROCESS CHECKS PASSED" in single.stdout
