"""Ending a launched job completely when a test gives up on it.

``accel launch`` (torchrun's agent) starts each worker in a session of its own, so neither ``Popen.kill`` nor
``os.killpg`` of the launcher's group reaches the workers. A worker left alive keeps the launcher's stdout and stderr
pipes open, and the test's read of them (``communicate``, which ``subprocess.run`` calls again after its own kill
on a timeout) then never ends: a test with a timeout hangs instead of failing, and CI runs into its limit.
``kill_tree`` kills the launcher and everything below it, found before the first kill while the tree is intact.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import psutil


def kill_tree(pid: int) -> None:
    """SIGKILLs ``pid``, every process below it, and the rest of its process group. Does not reap ``pid``: when it
    is this process's child, its ``Popen`` does (psutil's wait would take the exit status from it)."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # a member that already left the tree (reparented), when pid leads its group
    psutil.wait_procs(family[1:], timeout=10)


def run(
    command: Sequence[str], env: dict[str, str], timeout: float, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout)``, started in a
    session of its own, whose timeout ends the whole tree (``kill_tree``) before it raises
    ``subprocess.TimeoutExpired`` with the output so far."""
    process = subprocess.Popen(
        list(command),
        env=env,
        cwd=cwd,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(input=stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(process.args, timeout, stdout, stderr) from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
