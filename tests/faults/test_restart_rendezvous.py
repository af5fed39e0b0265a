"""A restarted attempt sets its process groups up from keys of its own, whatever the rendezvous keeps.

torchrun's static rendezvous (and the c10d one when it shares its store) serves one store to every
attempt; without a per-attempt prefix a restarted worker read the killed attempt's gloo addresses
(``Connection refused``) or waited for spent keys.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from accel_core.attempt_store import attempt_prefix

HERE = Path(__file__).resolve().parent


def test_the_prefix_is_per_attempt_only_where_the_agent_shares_its_store() -> None:
    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert attempt_prefix({**shared, "TORCHELASTIC_RESTART_COUNT": "2"}) == "accel/attempt_2/"
    assert attempt_prefix(shared) == "accel/attempt_0/"
    assert attempt_prefix({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None  # a fresh store per attempt
    assert attempt_prefix({"TORCHELASTIC_USE_AGENT_STORE": "True"}) is None  # no agent address: torch's env://


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_restart_under_the_static_rendezvous_sets_its_groups_up_afresh() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1"]
    command += ["--rdzv-backend=static", "--master-addr=127.0.0.1", f"--master-port={port}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*command, str(HERE / "static_rendezvous_restart.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "Connection refused" not in output
    # The first attempt lost rank 1; the second (restart count 1) got both ranks through a gloo group.
    # Two ranks share the pipe, so one line can land in the middle of another: find the records, not lines.
    assert sorted(re.findall(r"ok attempt=\d+ rank=\d+ sum=[0-9.]+", run.stdout)) == [
        "ok attempt=1 rank=0 sum=3",
        "ok attempt=1 rank=1 sum=3",
    ], output
