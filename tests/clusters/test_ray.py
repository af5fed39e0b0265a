"""Ray Train: ``TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2))`` with a plain ``Accelerator()``
inside ``train_func`` (tests/clusters/ray_train.py). Ray joins its workers in a torch.distributed group before
``train_func`` runs; the Accelerator must join that group, and train as ``accel launch --cpu -n 2`` does, bit for
bit.

Ray runs in a network namespace of the test's own (its daemons listen there only): ``ray start --head`` with the
agents' ports given, then the driver, then ``ray stop``. Ray 2.60's raylet waits 15 s for its dashboard agent to
report its ports and aborts after (``WaitForDashboardAgentPorts``): on an idle 2-core machine the agent takes a few
seconds, on one loaded ten times over about 30 s, so the start is tried up to three times (at load 15-29 all
three failed; the job itself, run once with the Ray processes given a larger CPU share, trained bit-identically).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest
from checkrun import worker_env
from engine_runs import TrainingRun, run_job
from netlab import machines

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

HERE = Path(__file__).resolve().parent
RAY = Path(sys.executable).parent / "ray"
PORTS = "--port 6379 --dashboard-agent-listen-port 52365 --dashboard-agent-grpc-port 52366"
PORTS += " --runtime-env-agent-port 52367 --metrics-export-port 52368"


def test_ray_train_workers_join_with_a_plain_accelerator(reference_run, tmp_path):
    if importlib.util.find_spec("ray") is None or not RAY.exists():
        pytest.skip("Ray is not installed (the workspace's dev group has it: uv sync)")
    ray, python = shlex.quote(str(RAY)), shlex.quote(sys.executable)
    start = f"{ray} start --head --num-cpus 2 --object-store-memory 100000000 --include-dashboard false"
    start += f" --disable-usage-stats {PORTS}"
    # Up to three starts: on a loaded machine the raylet can give up on its agents (above); a second start finds
    # their imports in the page cache.
    script = (
        f"for attempt in 1 2 3; do {start} && break; {ray} stop --force >/dev/null 2>&1; "
        f"[ $attempt = 3 ] && echo 'Ray did not start (raylet aborted: WaitForDashboardAgentPorts?)' && exit 99; "
        f"done; RAY_ADDRESS=auto {python} {HERE / 'ray_train.py'} {tmp_path}; "
        f"status=$?; {ray} stop --force >/dev/null 2>&1; exit $status"
    )
    # The workers import cluster_train from this folder; no worker is started before the trainer asks for them.
    # RAY_ENABLE_UV_RUN_RUNTIME_ENV=0: the suite runs under `uv run`, and Ray would otherwise package this checkout
    # and rebuild it in a fresh uv environment for its workers (fetching the build backend from PyPI).
    env = worker_env(
        {"RAY_enable_worker_prestart": "0", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    )
    env["PYTHONPATH"] = f"{HERE}:{env['PYTHONPATH']}"
    with machines(1, hostname_prefix="ray-node") as (machine,):
        done = run_job(machine.command(["bash", "-c", script]), env, timeout=400)
    run = TrainingRun.read(tmp_path, done.stdout + done.stderr)
    assert all(r["group_before"] for r in run.reports), run.reports  # Ray's group existed before the Accelerator
    run.assert_same_training(reference_run)
