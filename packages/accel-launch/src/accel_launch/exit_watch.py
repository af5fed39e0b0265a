"""When did a worker end? The last moment this process saw it running.

A worker killed by a signal (the out-of-memory killer's SIGKILL) leaves no record of its own, and
torchrun's agent notes its end in whole seconds, whenever it next looks (late, on a loaded
machine). A rank that raised *because* that worker vanished records an exact time, which can then
look earlier than the real cause. This watch notes when each child was last seen running
(``/proc/<pid>/stat``: not a zombie, not in the kernel's exit path), which reaps nothing: the worker
ended after the last time it was seen running, however late anyone else looked. Linux only
(elsewhere it watches nothing); no torch.

When it looks: whenever something may have begun to fail, not on a clock. It sleeps in ``poll``
on a pidfd per child (readable once that child has ended) and on a FIFO in the launcher's
finish-records folder, to which a worker's runner writes a byte the moment it records a failure
(``announce_failure``), and it looks at every child as it wakes. So a rank that dies, by a signal,
*after* a peer failed and because of it, was seen running after that peer's failure, and is not
taken for the cause. Between failures it wakes every ``rescan`` seconds; each wake-up also looks
for new children (a restart starts new ones).

Why not a look every 5 ms, as before: that thread ran in the launcher while the workers start and
train on the same cores, 3.4-4.8% of a core on this 2-core machine (``bench/launch_watch.py``; now
0.0-0.1%), and a poll's last sighting could still be a period early. Without pidfds (Linux before
5.3) it falls back to that poll, every ``period`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from types import TracebackType

from .finish_records import FINISH_RECORDS

# The FIFO in the finish-records folder (FINISH_RECORDS) that runners write to as a rank begins to fail.
FAILING_FIFO = "failing"


def announce_failure() -> None:
    """Tells the launcher's watch that this worker is failing (under ``accel launch``; never raises, never blocks).

    Call it after taking the failure's time: the watch then sees every other rank running after that time.
    """
    folder = os.environ.get(FINISH_RECORDS)
    if not folder:
        return
    # Non-blocking: without a reader (a launcher that is gone) the open fails (ENXIO) instead of waiting.
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(folder, FAILING_FIFO), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.write(fd, b"!")
        finally:
            os.close(fd)


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


def _running(stat_fd: int) -> bool:
    """Whether the process whose ``/proc/<pid>/stat`` is open as ``stat_fd`` runs and has not begun to exit:
    ended, a zombie or in the kernel's exit path is not running.

    The exit path matters: a killed worker's sockets close there, before it becomes a zombie, so a
    peer can raise "Connection closed by peer" while the worker still looks alive to ``waitid``.
    An open ``stat`` file keeps naming its process: once that process is reaped the read fails
    (ESRCH), even if a new process has taken the pid.
    """
    try:
        fields = os.pread(stat_fd, 1024, 0).rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    # After the command's closing parenthesis: state, ppid, pgrp, session, tty, tpgid, flags.
    return bool(fields) and fields[0] not in (b"Z", b"X", b"x") and not int(fields[6]) & _PF_EXITING


class _Child:
    """A watched child: its open ``stat`` file, and its pidfd (None without pidfd support)."""

    def __init__(self, pid: int, use_pidfd: bool) -> None:
        self.stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        self.pidfd: int | None = None
        if use_pidfd and hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):  # ENOSYS before Linux 5.3: polled instead
                self.pidfd = os.pidfd_open(pid)

    def close(self) -> None:
        for fd in (self.stat_fd, self.pidfd):
            if fd is not None:
                os.close(fd)


class ChildExitWatch:
    """``alive_at``: child pid -> the last time it was seen running.

    Use as a context manager around the code that starts and waits for the workers::

        with ChildExitWatch(fifo_folder) as watch:
            run_agent()
        watch.alive_at  # {pid: time}

    fifo_folder: where to make the ``FAILING_FIFO`` the workers announce failures to (the folder of
    ``FINISH_RECORDS``; None: no announcements, only child exits wake the watch). rescan: seconds between
    looks for new children. period: seconds between looks where pidfds are missing (or ``use_pidfds`` is
    False: the fallback, for measuring it).
    """

    def __init__(
        self, fifo_folder: str | None = None, rescan: float = 0.5, period: float = 0.005, use_pidfds: bool = True
    ) -> None:
        self.rescan = rescan
        self.period = period
        self.use_pidfds = use_pidfds
        self.alive_at: dict[int, float] = {}
        self._fifo_folder = fifo_folder
        self._children: dict[int, _Child] = {}
        self._seen: set[int] = set()
        self._poller = select.poll()
        self._by_fd: dict[int, int] = {}  # pidfd -> pid
        self._stop = threading.Event()
        self._wake_read, self._wake_write = -1, -1
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return os.path.isdir(f"/proc/{os.getpid()}")

    def _add_new_children(self) -> None:
        for pid in child_pids() - self._seen:
            self._seen.add(pid)
            try:
                child = _Child(pid, self.use_pidfds)
            except OSError:  # already gone
                continue
            self._children[pid] = child
            if child.pidfd is not None:
                self._by_fd[child.pidfd] = pid
                self._poller.register(child.pidfd, select.POLLIN)

    def _forget(self, pid: int) -> None:
        child = self._children.pop(pid)
        if child.pidfd is not None:
            self._poller.unregister(child.pidfd)
            del self._by_fd[child.pidfd]
        child.close()

    def _look(self) -> None:
        for pid, child in list(self._children.items()):
            now = time.time()  # before the read: a child running at the read was running at `now`
            if _running(child.stat_fd):
                self.alive_at[pid] = now
            else:
                self._forget(pid)

    def _drain(self, fd: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(fd, 4096):
                pass

    def _timeout_ms(self) -> int:
        polled = any(child.pidfd is None for child in self._children.values())
        return int(1000 * (self.period if polled else self.rescan))

    def _run(self, fifo_fd: int | None) -> None:
        while not self._stop.is_set():
            for fd, _ in self._poller.poll(self._timeout_ms()):
                if fd in (fifo_fd, self._wake_read):
                    self._drain(fd)
                # Else a pidfd: that child ended; the look below finds it not running and forgets it.
            self._add_new_children()  # a few small reads, on each wake-up (rare: see the module's docstring)
            self._look()

    def _open_fifo(self) -> int | None:
        if self._fifo_folder is None:
            return None
        path = os.path.join(self._fifo_folder, FAILING_FIFO)
        try:
            os.mkfifo(path, 0o600)
            # Read and write: with a writer of its own, the FIFO never reports a hang-up between workers' writes.
            return os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None

    def __enter__(self) -> ChildExitWatch:
        if self.available():
            fifo_fd = self._open_fifo()
            self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            for fd in (fifo_fd, self._wake_read):
                if fd is not None:
                    self._poller.register(fd, select.POLLIN)
            self._thread = threading.Thread(
                target=self._watch, args=(fifo_fd,), name="accel-child-exit-watch", daemon=True
            )
            self._thread.start()
        return self

    def _watch(self, fifo_fd: int | None) -> None:
        try:
            self._run(fifo_fd)
        finally:
            for pid in list(self._children):
                self._forget(pid)
            for fd in (fifo_fd, self._wake_read):
                if fd is not None:
                    os.close(fd)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            os.write(self._wake_write, b"!")  # out of `poll` at once
            self._thread.join()
            os.close(self._wake_write)
