"""A training process killed while its DataLoader workers start leaves no worker behind (accel_data.worker_guard).

Each script below SIGKILLs itself while its two workers are inside ``worker_init_fn``. torch's own loader
(the control) leaves them waiting for ever; a prepared loader's workers end once the function returns.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accel_data.worker_guard import OrphanedWorkerGuard, guarded

SCRIPT = Path(__file__).with_name("orphaned_workers_script.py")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X", b"x")


def test_guard_wraps_once_and_calls_the_users_function():
    calls = []
    guard = guarded(calls.append)
    assert isinstance(guard, OrphanedWorkerGuard) and guarded(guard) is guard
    guard(3)  # this process prepared it and lives: the user's function runs
    assert calls == [3] and guarded(None).user_fn is None


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard looks at /proc")
def test_workers_of_a_killed_process_end_with_the_guard_and_linger_without_it(tmp_path):
    folders = {kind: tmp_path / kind for kind in ("prepared", "raw")}
    for folder in folders.values():
        folder.mkdir()
    workers: dict[str, list[int]] = {}
    # Output to files, not pipes: a lingering worker would hold a pipe open and hang the read.
    with contextlib.ExitStack() as logs:
        runs = {
            kind: subprocess.Popen(
                [sys.executable, str(SCRIPT), str(folder), kind],
                stdout=logs.enter_context(open(tmp_path / f"{kind}.log", "wb")),
                stderr=subprocess.STDOUT,
            )
            for kind, folder in folders.items()
        }
    try:
        for kind, run in runs.items():
            assert run.wait(timeout=120) == -signal.SIGKILL, (tmp_path / f"{kind}.log").read_text()
            workers[kind] = [int(name) for name in os.listdir(folders[kind])]
            assert len(workers[kind]) == 2
        # The workers leave worker_init_fn 1.5 s after they entered it; torch's own check of its parent runs
        # every 5 s after that. 8 s covers both.
        deadline = time.monotonic() + 8
        while any(map(_running, workers["prepared"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, workers["prepared"])), "a prepared loader's worker outlived its process"
        while time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(map(_running, workers["raw"])), "the control no longer reproduces torch's lingering workers"
    finally:
        for pid in [pid for pids in workers.values() for pid in pids]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
