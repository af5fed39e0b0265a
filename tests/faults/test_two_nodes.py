"""Two nodes on one machine's loopback: one node lost and started again, the job resumes bit-identically.

Two ``accel launch --num-machines 2 --machine-rank {0,1} --main-process-ip 127.0.0.1`` agents (one
process each) run ``restartable_train.py`` as one job. At a random optimizer step node 1's worker
SIGKILLs its own agent and itself (the whole node lost); node 1 is then started again, as SLURM or
Kubernetes restarts a lost node's command. ``--max-restarts`` makes ``accel launch`` choose torchrun's
c10d rendezvous, whose next round takes the new agent in: both nodes' workers restart, resume from the
newest complete checkpoint, and end with the weights and metrics of an uninterrupted run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from nodes import NodeAgent, finish, free_port
from safetensors.torch import load_file

from accel_tracking.local import read_metrics

STEPS = 16  # restartable_train.py: 64 samples / (2 processes x 4) = 8 micro-batches per epoch, 2 per step, 4 epochs
SAVE_EVERY = 3
TIMEOUT = 600  # per node agent; a loaded 2-core machine takes minutes for the job and its restart
SCRIPT = Path(__file__).resolve().parent / "restartable_train.py"


def _env(plan: dict[str, list[object]] | None = None) -> dict[str, str]:
    # SIGKILL loses processes, not the page cache: fsync would only slow the saves down.
    return {"OMP_NUM_THREADS": "1", "ACCEL_CHECKPOINT_FSYNC": "0", "FAULT_PLAN": json.dumps(plan or {})}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_lost_node_started_again_rejoins_and_the_job_resumes_bit_identically(
    tmp_path: Path, restartable_reference: Path
) -> None:
    seed = random.SystemRandom().randrange(2**32)
    kill_at = random.Random(seed).randint(SAVE_EVERY + 1, STEPS - 2)  # after a save
    port = free_port()
    why = f"seed {seed}: node 1 lost after step {kill_at}, port {port}"
    project = tmp_path / "two_nodes"
    project.mkdir()
    launch = ["--cpu", "--num-machines", "2", "--main-process-ip", "127.0.0.1", "--main-process-port", str(port)]
    # The lost agent is declared dead after 5 missed 1 s keep-alives, not torch's 3 x 5 s: until then the restart's
    # round counts it as a participant and cannot take the node started again in.
    launch += ["--rdzv-conf", "keep_alive_interval=1,keep_alive_max_attempt=5"]
    launch += ["-n", "2", "--max-restarts", "2", "--auto-resume", str(SCRIPT), str(project)]

    node0 = NodeAgent.start("0", 0, launch, _env(None))
    node1 = NodeAgent.start("1", 1, launch, _env({"0": [None, kill_at, "node"]}))
    try:
        lost = node1.wait(TIMEOUT)
        assert lost == -9, f"{why}: node 1's agent should have been SIGKILLed, ended {lost}\n{node1.output()}"
        node1 = NodeAgent.start("1 again", 1, launch, _env(None))  # the scheduler starts the node again
        codes = finish([node0, node1], TIMEOUT)
    finally:
        node0.kill()
        node1.kill()
    assert codes == {"0": 0, "1 again": 0}, f"{why}: {codes}\n{node0.output()}\n{node1.output()}"

    # The restart happened: node 0's agent restarted its worker (restart count 1), node 1's new agent
    # started its first; both resumed from the newest checkpoint before the loss.
    attempts = [json.loads(line) for line in (project / "attempts.jsonl").read_text().splitlines()]
    resumed = [a for a in attempts if a["resumed_from"] is not None]
    assert sorted(a["rank"] for a in resumed) == [0, 1], (why, attempts)
    assert sorted(a["attempt"] for a in resumed) == [0, 1], (why, attempts)  # node 0's restart, node 1's first
    expected = (kill_at - 1) // SAVE_EVERY * SAVE_EVERY  # a kill after step s comes before that step's save
    assert {a["completed_steps"] for a in resumed} == {expected}, (why, attempts)
    assert resumed[0]["resumed_from"].endswith(f"checkpoint_{expected // SAVE_EVERY - 1}"), (why, attempts)

    # Bit-identical to the uninterrupted run; the metrics continue in the same run, each step once.
    reference, got = load_file(restartable_reference / "final.safetensors"), load_file(project / "final.safetensors")
    assert reference.keys() == got.keys()
    for name in reference:
        assert torch.equal(reference[name], got[name]), f"{name} differs ({why})"
    metrics, reference_metrics = read_metrics(project / "run"), read_metrics(restartable_reference / "run")
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1)), why
    assert [r["loss"] for r in metrics] == [r["loss"] for r in reference_metrics], why
