"""One job at a time in a project folder: a lock file that names its holder, held while the job runs.

Two jobs writing automatic checkpoints into one ``project_dir`` number them alike, delete each other's unfinished
saves and resume from each other's checkpoints. The main process of a job with automatic checkpoints takes
``<project_dir>/.accel-project.lock`` at its first automatic save, load or resume: an exclusive POSIX lock
(``lockf``: this process's alone, not its forked children's; freed by the kernel when the process ends, however it
ends) on a file holding the holder's host, pid, start time and job id.

- Held by a live job: refused, naming that job's host and pid (and, when it is another host, how to remove the lock).
- Left by a process that is gone (the lock is free, the file names a pid of this host that does not run): taken over,
  saying so. A restarted attempt of the same job (``accel launch --max-restarts``, ``--auto-resume``) meets its
  previous attempt's file this way, since the agent ends a failed attempt's processes before starting the next.
- Left by another host's process, the lock free: the same job (its ``TORCHELASTIC_RUN_ID``, when set) takes it over;
  another is refused with the file to delete, since this host cannot see whether that process still runs (a file
  system whose locks do not reach other hosts would otherwise let two jobs in).

The lock is released (its file deleted, then unlocked) when the last Accelerator of this process that holds it is
garbage-collected, and by the kernel when the process ends.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from accel_core.checkpointing.errors import CheckpointError

logger = logging.getLogger(__name__)

LOCK_NAME = ".accel-project.lock"
_RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
_NO_FLOCK = {errno.ENOSYS, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP}  # a file system without locks


class ProjectLockedError(CheckpointError):
    """Another job holds the project folder's lock."""


@dataclass
class _Held:
    fd: int
    path: str
    users: int = 1


_held: dict[str, _Held] = {}
_guard = threading.Lock()


def _record() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started_unix": time.time(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "job": os.environ.get(_RUN_ID_ENV) or None,
    }


def _read(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        found = json.loads(raw) if raw.strip() else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _pid_runs(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _holder(record: dict[str, Any] | None) -> str:
    if record is None:
        return "another process (its lock file names no holder)"
    job = f", job {record['job']}" if record.get("job") else ""
    return f"pid {record.get('pid')} on host {record.get('host')} (started {record.get('started')}{job})"


def _refuse(project_dir: str, path: str, record: dict[str, Any] | None, live: bool) -> ProjectLockedError:
    elsewhere = record is not None and record.get("host") != socket.gethostname()
    state = "is in use by" if live else "was left locked by"
    if elsewhere:
        fix = (
            f"If that job has ended (its host can no longer be asked: a crash or a lost machine), delete {path} "
            "and start again"
        )
    else:
        fix = "Wait for that job to end, or stop it"
    return ProjectLockedError(
        f"The project folder {project_dir} {state} another job: {_holder(record)}. Two jobs writing automatic "
        "checkpoints into one folder would number them alike and resume each other's. Give this job its own "
        f"ProjectConfiguration(project_dir=...). {fix}."
    )


def _open_locked(path: str) -> tuple[int, bool]:
    """(fd of ``path`` locked exclusively, whether locking works here); raises BlockingIOError while it is held."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl

            # A POSIX record lock, not flock: it belongs to this process alone. A flock is shared with every child
            # forked while it is held (DataLoader workers), so a SIGKILLed main process's lock outlived it in its
            # children and refused the restarted attempt (seen in CI's auto-resume matrix).
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locking = True
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EAGAIN):
                os.close(fd)
                raise BlockingIOError(error.errno, "held") from None
            if error.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            locking = False
        # A holder that released (and deleted the file) between our open and our lock: lock the new file instead.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, locking
        os.close(fd)


def acquire(project_dir: str) -> str:
    """Takes (or shares, within this process) the lock of ``project_dir``; returns the lock file's path.

    Raises ``ProjectLockedError`` naming the holder when another job has it.
    """
    folder = os.path.realpath(project_dir)
    path = os.path.join(folder, LOCK_NAME)
    with _guard:
        held = _held.get(folder)
        if held is not None:
            held.users += 1
            return path
        os.makedirs(folder, exist_ok=True)
        try:
            fd, locking = _open_locked(path)
        except BlockingIOError:
            with open(path, "rb") as handle:
                raw = handle.read(65536)
            try:
                record = json.loads(raw) if raw.strip() else None
            except ValueError:
                record = None
            raise _refuse(project_dir, path, record if isinstance(record, dict) else None, live=True) from None
        try:
            previous = _read(fd)
            _check_previous(project_dir, path, previous, locking)
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(_record()).encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        _held[folder] = _Held(fd, path)
        return path


def _check_previous(project_dir: str, path: str, previous: dict[str, Any] | None, locking: bool) -> None:
    """The lock is ours (or locks do not work here): what the file says of its last holder decides."""
    if previous is None or (previous.get("pid") == os.getpid() and previous.get("host") == socket.gethostname()):
        return
    here = previous.get("host") == socket.gethostname()
    job = os.environ.get(_RUN_ID_ENV)
    same_job = bool(job) and job != "none" and previous.get("job") == job
    if here:
        if not locking and _pid_runs(previous.get("pid")):
            raise _refuse(project_dir, path, previous, live=True)  # no locks here: the pid is all there is to go by
        logger.warning(
            "Took over the lock of %s left by %s, which no longer runs%s.",
            project_dir,
            _holder(previous),
            " (a previous attempt of this job)" if same_job else "",
        )
        return
    if same_job:
        logger.warning(
            "Took over the lock of %s left by a previous attempt of this job: %s.", project_dir, _holder(previous)
        )
        return
    raise _refuse(project_dir, path, previous, live=False)


def release(project_dir: str) -> None:
    """Drops one use of this process's lock of ``project_dir``; the last one deletes the file, then unlocks."""
    folder = os.path.realpath(project_dir)
    with _guard:
        held = _held.get(folder)
        if held is None:
            return
        held.users -= 1
        if held.users > 0:
            return
        del _held[folder]
        with contextlib.suppress(OSError):
            os.unlink(held.path)  # while still locked: a job that opened the old file sees it gone and re-opens
        os.close(held.fd)
