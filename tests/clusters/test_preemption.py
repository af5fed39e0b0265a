"""SLURM preemption: ``sbatch --requeue`` of ``preemptible_train.py``, ``scontrol requeue`` mid-run.

The requeue sends SIGTERM to every task: each saves a checkpoint at the end of its step and exits 143
(``checkpoint_on_sigterm=True``); SLURM starts the job again (``SLURM_RESTART_COUNT=1``) and ``resume="auto"``
continues from that checkpoint. The final weights equal an uninterrupted ``srun`` of the same script, bit for bit.
The batch file is ``preemptible.sbatch``, shown in docs/checkpointing.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from checkrun import worker_env
from processes import kill_tree
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

HERE = Path(__file__).resolve().parent
REQUEUE_AFTER_STEP = 7  # past the first periodic checkpoint (step 5), far from the end (32 steps)


def events(project: Path) -> list[dict]:
    path = project / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(condition, timeout: float, what: str, details) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s:\n{details()}")


def test_requeued_job_resumes_bit_identical(slurm, tmp_path):
    project, reference = tmp_path / "preempted", tmp_path / "uninterrupted"
    project.mkdir()
    reference.mkdir()
    log = tmp_path / "job.out"
    env = slurm.env(worker_env({"STEP_SECONDS": "0.5"}))
    submitted = subprocess.run(
        slurm.command(
            ["sbatch", "--parsable", f"--chdir={HERE}", f"--output={log}", "preemptible.sbatch", str(project)]
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job = submitted.stdout.strip().split(";")[0]
    # The uninterrupted run, meanwhile (the cluster has room for both): same script, no sleeps.
    uninterrupted = subprocess.Popen(
        slurm.command(
            ["srun", "-N", "1", "-n", "2", sys.executable, str(HERE / "preemptible_train.py"), str(reference)]
        ),
        env=slurm.env(worker_env()),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:

        def job_story() -> str:
            return f"{log.read_text() if log.exists() else '(no output)'}\nevents: {events(project)}"

        def stepped_far_enough() -> bool:
            return any(e["event"] == "step" and e["step"] >= REQUEUE_AFTER_STEP for e in events(project))

        wait_for(stepped_far_enough, 300, f"step {REQUEUE_AFTER_STEP} of job {job}", job_story)
        slurm.query("scontrol", "requeue", job)

        def pending_again() -> bool:
            return slurm.job_field(job, "JobState") == "PENDING" and slurm.job_field(job, "Restarts") == "1"

        wait_for(pending_again, 120, f"job {job} back in the queue", job_story)
        # SLURM holds a requeued job for two minutes before it may start (Reason=BeginTime): start it now.
        slurm.query("scontrol", "update", f"JobId={job}", "StartTime=now")

        def completed() -> bool:
            return slurm.job_field(job, "JobState") == "COMPLETED"

        wait_for(completed, 300, f"the end of the requeued job {job}", job_story)
        output, _ = uninterrupted.communicate(timeout=300)
    finally:
        kill_tree(uninterrupted.pid)
        uninterrupted.wait()
    assert uninterrupted.returncode == 0, output

    seen = events(project)
    first_exits = [e for e in seen if e["event"] == "exit" and e["restart"] == 0]
    assert sorted(e["rank"] for e in first_exits) == [0, 1], job_story()
    assert {e["code"] for e in first_exits} == {143}, first_exits  # the emergency checkpoint's exit, on every rank
    saved_at = {e["completed_steps"] for e in first_exits}
    assert len(saved_at) == 1 and REQUEUE_AFTER_STEP <= min(saved_at) < 32, first_exits
    resumed = [e for e in seen if e["event"] == "start" and e["restart"] == 1]
    assert sorted(e["rank"] for e in resumed) == [0, 1], job_story()
    assert {e["completed_steps"] for e in resumed} == saved_at, resumed  # resumed from the SIGTERM checkpoint
    assert all(e["resumed_from"] for e in resumed), resumed
    assert slurm.job_field(job, "Restarts") == "1"
    text = log.read_text()
    assert "attempt 0 of job" in text and "attempt 1 of job" in text, text
    assert f"Resumed from {resumed[0]['resumed_from']} at step {min(saved_at)}" in text, text

    final, expected = load_file(str(project / "final.safetensors")), load_file(str(reference / "final.safetensors"))
    for name, tensor in expected.items():
        assert torch.equal(final[name], tensor), f"{name} differs from the uninterrupted run's"
