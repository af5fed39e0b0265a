"""SPMD sharding on XLA's CPU device with 4 virtual devices (CPU_NUM_DEVICES=4): FSDPv2 over dp_shard, 2-D sharding
with tensor parallelism, checkpoints of sharded parameters, the XLA RNG seed across a checkpoint.

SPMD mode, once on, stays on for the whole process, so the checks run in one process of their own
(tests/xla/spmd_job.py) and this test reads its figures. Needs torch-xla (tests/xla/run.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch_xla", reason="needs torch-xla: run tests/xla/run.sh")

JOB = Path(__file__).with_name("spmd_job.py")


@pytest.fixture(scope="module")
def figures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("spmd")
    environ = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}
    done = subprocess.run(
        [sys.executable, str(JOB), str(folder)], env=environ, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp_shard", "dp_shard_tp"])
def test_spmd_training_matches_plain_cpu(figures: dict[str, Any], layout: str) -> None:
    run = figures[layout]
    assert len(run["losses"]) == 10
    for got, want in zip(run["losses"], run["reference"], strict=True):
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (run["losses"], run["reference"])
    # (dp_shard with 2 accumulation steps and clipping.) One process drives the 4 devices: core sees one process
    # reading whole batches.
    assert run["num_processes"] == 1 and run["distributed_type"] == "XLA"
    assert set(run["process_layout"].values()) == {1}
    assert run["wrapped"] == "SpmdFullyShardedDataParallel"


@pytest.mark.slow
def test_fsdp_shards_every_parameter_and_the_batch(figures: dict[str, Any]) -> None:
    run = figures["dp_shard"]
    assert run["device_layout"]["dp_shard"] == 4 and run["device_layout"]["tp"] == 1
    # The largest dimension of each parameter over the 4 devices (FSDPv2's rule), as torch-xla reports it.
    assert run["params"]["0.weight"] == {"spec": ["fsdp", None], "xla": "{devices=[4,1]0,1,2,3}"}
    assert run["params"]["2.weight"] == {"spec": [None, "fsdp"], "xla": "{devices=[1,4]0,1,2,3}"}
    assert run["params"]["2.bias"]["xla"] == "{devices=[4]0,1,2,3}"
    assert run["batch"] == {"x": "{devices=[4,1]0,1,2,3}", "y": "{devices=[4,1]0,1,2,3}"}


@pytest.mark.slow
def test_tensor_parallel_plan_shards_in_two_dimensions(figures: dict[str, Any]) -> None:
    run = figures["dp_shard_tp"]
    assert run["device_layout"]["dp_shard"] == 2 and run["device_layout"]["tp"] == 2
    params = run["params"]
    assert params["0.weight"]["spec"] == ["tp", "fsdp"]  # colwise: output features over tp
    assert params["0.bias"]["spec"] == ["tp"]
    assert params["2.weight"]["spec"] == ["fsdp", "tp"]  # rowwise: input features over tp
    assert params["0.weight"]["xla"].startswith("{devices=[2,2]") and "replicate" not in params["0.weight"]["xla"]
    # The batch is split over dp_shard and whole on each tp pair.
    assert run["batch"]["x"] == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"


@pytest.mark.slow
def test_sharded_checkpoint_holds_whole_tensors_and_reshards_on_load(figures: dict[str, Any]) -> None:
    ck = figures["checkpoint"]
    assert ck["files"] == ["model_0.bin", "optimizer_0.bin", "xla_rng_state_0.json"]
    assert ck["on_disk_shapes"] == {"0.weight": [16, 6], "0.bias": [16], "2.weight": [4, 16], "2.bias": [4]}
    assert ck["on_disk_equal"] and ck["loaded_equal"] and ck["exp_avg_equal"]
    assert ck["exported_equal"], "save_model's safetensors differ from the gathered weights"
    assert ck["loaded_sharding"] == ck["exp_avg_sharding"] == "{devices=[2,2]0,2,1,3}"
    assert ck["rng_restored"], "the XLA random draws after load_state differ from those after save_state"
