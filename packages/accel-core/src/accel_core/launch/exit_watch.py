"""When did a worker end? The last moment this process saw its children all running.

A worker killed by a signal (the out-of-memory killer's SIGKILL) leaves no record of its own, and
torchrun's agent notes its end in whole seconds, whenever it next looks (late, on a loaded
machine). A rank that raised *because* that worker vanished records an exact time, which can then
look earlier than the real cause. This watch samples, every few milliseconds, whether any child
has ended, without reaping it (``waitid`` with ``WNOWAIT``, so the agent still collects it): a
child first seen ended after a sample that found all running died after that sample. No torch.
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType


class ChildExitWatch:
    """Records, per child pid, the last time all children were seen running before it was seen ended.

    Use as a context manager around the code that starts and waits for the workers::

        with ChildExitWatch() as watch:
            run_agent()
        watch.alive_at  # {pid: time}

    period: seconds between samples (one system call each).
    """

    def __init__(self, period: float = 0.005) -> None:
        self.period = period
        self.alive_at: dict[int, float] = {}
        self._quiet_at = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return hasattr(os, "waitid") and hasattr(os, "WNOWAIT")

    def _sample(self) -> None:
        now = time.time()  # before the call: no child had ended at `now` if none has at the call
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # no children (not started yet, or all collected)
            info = None
        if info is None:
            self._quiet_at = now
        elif info.si_pid not in self.alive_at:
            self.alive_at[info.si_pid] = self._quiet_at

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def __enter__(self) -> ChildExitWatch:
        if self.available():
            self._thread = threading.Thread(target=self._run, name="accel-child-exit-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
