"""Elastic world size: a 2-node job (``--num-machines 1:2``) loses a node and continues alone; the node returns; the
node is lost again, for good, and the job ends alone.

``elastic_train.py`` runs under two ``accel launch --num-machines 1:2 --keep-global-batch --auto-resume``
agents on 127.0.0.1 (one process each). Node 1 SIGKILLs its agent and itself at a random optimizer
step; node 0's agent restarts its worker in a world of 1, which resumes from the newest complete
checkpoint (saved by 2 processes) and accumulates 2 micro-batches per step instead of 1, so every
optimizer step still averages the same 8 samples. Node 1 is started again once node 0 has run alone past
a save; it joins at the next rendezvous and the job continues in a world of 2, until node 1 is lost again
at a later step and node 0 ends the job alone. (One job for the three changes: the two scenarios were two
jobs of their own before, each with its two agents, its first round and a lost node's rendezvous wait.)

Checked: every sample of every epoch consumed exactly once over the steps that count (a step redone
after a restart replaces the lost round's record of it), each round's world size and accumulation,
and the final loss against an uninterrupted 2-process run. A change of world size is not bit-exact in
general: P processes average their gradients with an all-reduce (sum, then divide by P), one process
accumulates P micro-batches' gradients with each loss divided by P, i.e. the same numbers rounded in
another order (a ring all-reduce over more ranks, or a division by 3, rounds differently), and Adam
carries last-bit differences on. Between 2 and 1 processes the two happen to agree (a/2 + b/2 equals
(a + b)/2 in binary floating point), and the measured losses were equal; the test allows the general
tolerance.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import processes
import pytest
from nodes import NodeAgent, accel_command, finish, free_port

SCRIPT = Path(__file__).resolve().parent / "elastic_train.py"
SAMPLES, EPOCHS, STEPS, SAVE_EVERY = 64, 3, 24, 2  # 64 samples / (2 x 4) = 8 steps per epoch
TIMEOUT = 600  # per node agent: a loaded 2-core machine takes minutes for the job and its rendezvous rounds
# Same samples per step, same arithmetic up to rounding order: the losses agree to float32 noise.
LOSS_TOLERANCE = 1e-4  # relative
ENV = {"OMP_NUM_THREADS": "1", "ACCEL_CHECKPOINT_FSYNC": "0"}


def _launch_args(port: int, project: Path) -> list[str]:
    args = ["--cpu", "--num-machines", "1:2", "--main-process-ip", "127.0.0.1", "--main-process-port", str(port)]
    # A round with fewer than MAX machines starts 3 s after MIN joined, not torch's 30 s (rounds run 3-4 times a test).
    # The lost node's agent is declared dead after 5 missed 1 s keep-alives, not torch's 3 x 5 s: the survivor's
    # restart waits for that before its round can start without it (the default cost each test about 10 s idle).
    args += ["--rdzv-conf", "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=5"]
    return [*args, "-n", "2", "--max-restarts", "3", "--keep-global-batch", "--auto-resume", str(SCRIPT), str(project)]


def _records(project: Path) -> list[dict]:
    path = project / "samples.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip()]


def _counting_steps(records: list[dict]) -> dict[int, list[dict]]:
    """Each step's records from the last round that made it (a restarted round redoes the lost steps)."""
    by_step: dict[int, dict[str, list[dict]]] = defaultdict(dict)
    for line in records:
        if "step" in line:
            by_step[line["step"]].setdefault(line["round"], []).append(line)
    return {step: list(rounds.values())[-1] for step, rounds in sorted(by_step.items())}


def _assert_each_sample_once_per_epoch(steps: dict[int, list[dict]], why: str) -> None:
    assert sorted(steps) == list(range(1, STEPS + 1)), why
    for epoch in range(EPOCHS):
        seen = Counter(i for step in steps.values() for line in step if line["epoch"] == epoch for i in line["ids"])
        assert sorted(seen) == list(range(SAMPLES)), f"{why}: epoch {epoch} missed {set(range(SAMPLES)) - set(seen)}"
        assert set(seen.values()) == {1}, f"{why}: epoch {epoch} repeated {[i for i, n in seen.items() if n > 1]}"
    for step, lines in steps.items():  # the global batch kept: 8 samples per step in any world
        assert sum(len(line["ids"]) for line in lines) == 8, (why, step, lines)
        assert {line["accumulation"] for line in lines} == {2 // lines[0]["world"]}, (why, step, lines)


def _uninterrupted(project: Path) -> dict:
    """The same script on 2 processes of one agent, nothing lost: the final loss to compare with."""
    project.mkdir()
    command = [*accel_command(), "launch", "--cpu", "-n", "2", str(SCRIPT), str(project)]
    run = processes.run(command, {**os.environ, **ENV}, timeout=900)  # a timeout ends the workers too
    assert run.returncode == 0, run.stdout + run.stderr
    steps = _counting_steps(_records(project))
    _assert_each_sample_once_per_epoch(steps, "uninterrupted")
    return json.loads((project / "final.json").read_text())


def _run(project: Path, lose_at: int, pause_alone_at: int, lose_again_at: int) -> tuple[list[dict], dict]:
    """Node 1 lost after step ``lose_at``, started again once node 0 ran alone to ``pause_alone_at``, lost again after
    step ``lose_again_at``; node 0 ends the job."""
    project.mkdir()
    port = free_port()
    node0 = NodeAgent.start("0", 0, _launch_args(port, project), {**ENV, "PAUSE_ALONE_AT": str(pause_alone_at)})
    node1 = NodeAgent.start("1", 1, _launch_args(port, project), {**ENV, "LOSE_NODE_AT": str(lose_at)})
    again = None
    try:
        lost = node1.wait(TIMEOUT)
        assert lost == -9, f"node 1's agent should have been SIGKILLed, ended {lost}\n{node1.output()}"
        deadline = time.monotonic() + TIMEOUT
        while not any(r.get("paused") == pause_alone_at for r in _records(project)):
            assert node0.process.poll() is None and time.monotonic() < deadline, node0.output()
            time.sleep(0.5)
        again = NodeAgent.start("1 again", 1, _launch_args(port, project), {**ENV, "LOSE_NODE_AT": str(lose_again_at)})
        lost = again.wait(TIMEOUT)
        assert lost == -9, f"node 1 (again) should have been SIGKILLed, ended {lost}\n{again.output()}"
        codes = finish([node0], TIMEOUT)
    finally:
        for agent in [node0, node1, *([again] if again else [])]:
            agent.kill()
    assert codes == {"0": 0}, f"{codes}\n{node0.output()}"
    return _records(project), json.loads((project / "final.json").read_text())


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_lost_node_shrinks_the_world_a_returning_one_grows_it_and_every_sample_is_seen_once(tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    lose_at = rng.randint(SAVE_EVERY + 1, 8)  # after a save, with steps left for the rest
    resume_at = (lose_at - 1) // SAVE_EVERY * SAVE_EVERY  # the save of a step is taken when the next batch is read
    pause_at = resume_at + 2 * SAVE_EVERY  # two saves made alone, the second resumed from by the world of 2
    lose_again_at = rng.randint(pause_at + 3, STEPS - 6)  # a save of the world of 2 first; steps left to end alone
    resume_again_at = (lose_again_at - 1) // SAVE_EVERY * SAVE_EVERY
    why = f"seed {seed}: node 1 lost after step {lose_at}, back at {pause_at}, lost again after {lose_again_at}"
    # The uninterrupted run goes on meanwhile, in a thread: the elastic job spends much of its time waiting (a lost
    # agent's keep-alives, rendezvous rounds, a node's restart), which that run's work fills (23 s alone at load 9).
    with ThreadPoolExecutor(max_workers=1) as pool:
        reference = pool.submit(_uninterrupted, tmp_path / "uninterrupted")
        records, final = _run(tmp_path / "elastic", lose_at, pause_at, lose_again_at)
        uninterrupted = reference.result()

    steps = _counting_steps(records)
    _assert_each_sample_once_per_epoch(steps, why)
    # The rounds that count: 2 processes to the checkpoint before the loss, 1 alone, 2 again, 1 alone to the end.
    worlds = {step: lines[0]["world"] for step, lines in steps.items()}
    expected = {step: 2 if step <= resume_at or pause_at < step <= resume_again_at else 1 for step in steps}
    assert worlds == expected, (why, worlds)
    # Each lost round did reach its last step: its steps after the checkpoint were redone, not lost.
    for lost in (lose_at, lose_again_at):
        reached = max(r["step"] for r in records if "step" in r and r["world"] == 2 and r["step"] <= lost)
        assert reached == lost, (why, lost, reached)
    assert final["steps"] == STEPS, (why, final)
    assert abs(final["loss"] - uninterrupted["loss"]) <= LOSS_TOLERANCE * abs(uninterrupted["loss"]), (
        why,
        final,
        uninterrupted,
    )
