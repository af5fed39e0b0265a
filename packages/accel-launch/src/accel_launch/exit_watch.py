"""When did a worker end? The last moment this process saw it running.

A worker killed by a signal (the out-of-memory killer's SIGKILL) leaves no record of its own, and
torchrun's agent notes its end in whole seconds, whenever it next looks (late, on a loaded
machine). A rank that raised *because* that worker vanished records an exact time, which can then
look earlier than the real cause. This watch reads, every few milliseconds, whether each child is
still running (``/proc/<pid>/stat``: not a zombie, not in the kernel's exit path), which reaps
nothing: the worker ended after the last time it was seen running, however late anyone else
looked. Linux only (elsewhere it watches nothing); no torch.
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType


def child_pids() -> set[int]:
    """The pids of this process's children (Linux ``/proc``; empty elsewhere)."""
    me = os.getpid()
    children: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        return children
    for task in tasks:  # the kernel lists each thread's children, where it can
        try:
            with open(f"/proc/{me}/task/{task}/children") as handle:
                children.update(int(pid) for pid in handle.read().split())
        except OSError:
            break
    else:
        return children
    for entry in os.listdir("/proc"):  # no `children` files: find the processes whose parent is this one
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields and fields[1] == str(me):
                children.add(int(entry))
    return children


_PF_EXITING = 0x4  # the kernel's flag of a task that has begun to exit (set before it closes its sockets)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs and has not begun to exit: ended, a zombie or in the kernel's exit path is not running.

    The exit path matters: a killed worker's sockets close there, before it becomes a zombie, so a
    peer can raise "Connection closed by peer" while the worker still looks alive to ``waitid``.
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    # After the command's closing parenthesis: state, ppid, pgrp, session, tty, tpgid, flags.
    return fields[0] not in ("Z", "X", "x") and not int(fields[6]) & _PF_EXITING


class ChildExitWatch:
    """``alive_at``: child pid -> the last time it was seen running.

    Use as a context manager around the code that starts and waits for the workers::

        with ChildExitWatch() as watch:
            run_agent()
        watch.alive_at  # {pid: time}

    period: seconds between looks (one small read per child); new children are found every ``rescan`` seconds.
    """

    def __init__(self, period: float = 0.005, rescan: float = 0.5) -> None:
        self.period = period
        self.rescan = rescan
        self.alive_at: dict[int, float] = {}
        self._watched: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return os.path.isdir(f"/proc/{os.getpid()}")

    def _look(self) -> None:
        for pid in list(self._watched):
            now = time.time()  # before the read: a child running at the read was running at `now`
            if _running(pid):
                self.alive_at[pid] = now
            else:
                self._watched.discard(pid)

    def _run(self) -> None:
        next_scan = 0.0
        while not self._stop.wait(self.period):
            if time.monotonic() >= next_scan:
                self._watched |= child_pids() - set(self.alive_at)
                next_scan = time.monotonic() + self.rescan
            self._look()

    def __enter__(self) -> ChildExitWatch:
        if self.available():
            self._thread = threading.Thread(target=self._run, name="accel-child-exit-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
