"""Two jobs in one project folder: the second is refused naming the first (host, pid); a lock left by a process that
is gone is taken over, saying so; one from another host names the file to delete.

Before, the second job died with "checkpoint_0 already exists. Please manually override
`accelerator.project_configuration.iteration`" (a wrong fix), and a later run resumed the other job's checkpoint
without a word.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from accel_checkpoint.project_lock import LOCK_NAME, ProjectLockedError
from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration

HOST = socket.gethostname()


def _job(project: Path) -> Accelerator:
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    accelerator.prepare(torch.nn.Linear(4, 4))
    return accelerator


@pytest.mark.slow  # a second interpreter importing torch
def test_a_second_job_is_refused_naming_the_first_then_takes_over_once_it_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    project = tmp_path / "runs" / "exp"
    other = textwrap.dedent(
        f"""
        import sys, torch
        from accel_core import Accelerator
        from accel_core.configuration import ProjectConfiguration
        config = ProjectConfiguration(project_dir={str(project)!r}, automatic_checkpoint_naming=True)
        accelerator = Accelerator(cpu=True, project_config=config)
        accelerator.prepare(torch.nn.Linear(4, 4))
        print(accelerator.save_state(), flush=True)
        sys.stdin.read()  # runs until the test closes stdin or kills it
        """
    )
    first = subprocess.Popen(
        [sys.executable, "-c", other], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None
        saved = first.stdout.readline().strip()
        assert saved.endswith("checkpoint_0"), first.stderr.read() if first.stderr else ""
        accelerator = _job(project)
        for attempt in (accelerator.save_state, accelerator.load_state):
            with pytest.raises(ProjectLockedError) as caught:
                attempt()
            message = str(caught.value)
            print(message)
            assert message.startswith(
                f"The project folder {project.resolve()} is in use by another job: pid {first.pid} on host {HOST} "
                "(started "
            )
            assert message.endswith(
                "Two jobs writing automatic checkpoints into one folder would number them alike and resume each "
                "other's. Give this job its own ProjectConfiguration(project_dir=...). Wait for that job to end, or "
                "stop it."
            )
            assert "already exists" not in message
        del caught, attempt  # they hold the accelerator (its traceback's frames, a bound method)
        assert sorted(os.listdir(project / "checkpoints")) == ["checkpoint_0"]  # nothing written, nothing removed

        first.send_signal(signal.SIGKILL)  # a crash: the lock file stays behind, its flock is gone
        first.wait(timeout=60)
        assert json.loads((project / LOCK_NAME).read_text())["pid"] == first.pid
        with caplog.at_level(logging.WARNING, logger="accel_checkpoint"):
            assert accelerator.load_state().endswith("checkpoint_0")
            assert accelerator.save_state().endswith("checkpoint_1")
        took = [r.getMessage() for r in caplog.records if "Took over" in r.getMessage()]
        assert len(took) == 1 and took[0].startswith(
            f"Took over the lock of {project.resolve()} left by pid {first.pid} on host {HOST} (started "
        ), took
        assert took[0].endswith("which no longer runs.")
        assert json.loads((project / LOCK_NAME).read_text())["pid"] == os.getpid()
        del accelerator
        gc.collect()
        assert not (project / LOCK_NAME).exists()  # released with the Accelerator
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()


def test_a_lock_left_by_another_host_names_the_file_to_delete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "exp"
    project.mkdir()
    lock = project / LOCK_NAME
    left = {"host": "node-17", "pid": 4242, "started": "2026-12-06 10:00:00 UTC", "job": "job-a"}
    lock.write_text(json.dumps(left))
    accelerator = _job(project)
    with pytest.raises(ProjectLockedError) as caught:
        accelerator.save_state()
    message = str(caught.value)
    print(message)
    assert message == (
        f"The project folder {project.resolve()} was left locked by another job: pid 4242 on host node-17 (started "
        "2026-12-06 10:00:00 UTC, job job-a). Two jobs writing automatic checkpoints into one folder would number them "
        "alike and resume each other's. Give this job its own ProjectConfiguration(project_dir=...). If that job has "
        f"ended (its host can no longer be asked: a crash or a lost machine), delete {lock.resolve()} and start again."
    )
    assert not (project / "checkpoints").exists()
    # The same job restarted on another machine (its rendezvous run id): its previous attempt's lock is taken over.
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    assert accelerator.save_state().endswith("checkpoint_0")
    assert json.loads(lock.read_text())["host"] == HOST


def test_accelerators_of_one_process_share_the_lock(tmp_path: Path) -> None:
    """A script that makes a second Accelerator (a test, an evaluation pass) is one job: not refused by itself."""
    first = _job(tmp_path)
    first.save_state()
    second = _job(tmp_path)
    second.project_configuration.iteration = 1
    assert second.save_state().endswith("checkpoint_1")
    del first
    gc.collect()
    assert (tmp_path / LOCK_NAME).exists()  # the second still holds it
    del second
    gc.collect()
    assert not (tmp_path / LOCK_NAME).exists()


def test_explicit_folders_take_no_lock(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path)))
    accelerator.prepare(torch.nn.Linear(4, 4))
    accelerator.save_state(str(tmp_path / "ckpt"))
    assert not (tmp_path / LOCK_NAME).exists()
