"""Workers die with their launcher: Linux's parent-death signal, set in each worker.

A launcher killed with SIGKILL (by a user, a scheduler, the out-of-memory killer) cannot stop its
workers; without this they keep training and keep their GPU. ``prctl(PR_SET_PDEATHSIG)`` asks the
kernel to send a signal to the worker when the thread that started it ends. Elsewhere than Linux it
does nothing. No torch import.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# The launcher sets it in its workers' environment: the pid their parent must have.
LAUNCHER_PID = "ACCEL_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1

# SIGKILL, not SIGTERM: an orphan must end even if the script handles or ignores SIGTERM.
DEATH_SIGNAL = signal.SIGKILL if hasattr(signal, "SIGKILL") else None


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def die_with_parent(parent_pid: int | None, libc: ctypes.CDLL | None = None) -> bool:
    """Makes this process receive SIGKILL when its parent ends; returns whether it could.

    parent_pid: the pid the parent must have; when the parent already ended before this call (the
        process was re-parented), this process ends at once, as the signal would have ended it.
    """
    libc = libc if libc is not None else _libc()
    if libc is None or DEATH_SIGNAL is None:
        return False
    if libc.prctl(_PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), DEATH_SIGNAL)  # the launcher died before the signal was armed
    return True


def preexec_die_with_parent() -> object:
    """A ``preexec_fn`` for ``subprocess.Popen`` that arms the parent-death signal in the child.

    libc is loaded here, in the parent, so the child only makes the one system call between fork
    and exec. Returns ``None`` where the signal does not exist (pass it to Popen as is).
    """
    libc = _libc()
    if libc is None:
        return None
    parent = os.getpid()

    def arm() -> None:
        die_with_parent(parent, libc)

    return arm


def die_with_launcher() -> None:
    """In a worker of ``accel launch``: die with the launcher that started it (``ACCEL_LAUNCHER_PID``).

    The variable is removed from this process's environment so that processes the script starts
    (which have another parent) do not read it.
    """
    raw = os.environ.pop(LAUNCHER_PID, None)
    if raw is None or not raw.isdigit():
        return
    launcher = int(raw)
    if os.getppid() == launcher:
        die_with_parent(launcher)
        return
    try:
        os.kill(launcher, 0)
    except ProcessLookupError:  # it died while this worker started: end as the signal would have ended it
        if DEATH_SIGNAL is not None:
            os.kill(os.getpid(), DEATH_SIGNAL)
    except PermissionError:
        pass
    # Otherwise something between the launcher and this process (a wrapper) is the parent: leave it be.
