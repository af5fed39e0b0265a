"""A DataLoader worker whose training process died while it started ends, instead of waiting forever.

torch's worker notes its parent's pid once it has started (after ``worker_init_fn``) and ends when
its parent changes. A training process killed while its workers start (the out-of-memory killer, a
failed rank's SIGKILL under ``accel launch``) is already gone by then: the worker notes the process
it was handed to instead, never sees a change, and waits on its queue for ever, holding the
dataset's memory and the launcher's output pipe (whoever reads the job's log to its end waits too).
Found when a CI run hung on such a worker.

The prepared loaders' ``worker_init_fn`` is wrapped: before and after the user's function the worker
looks at the process that prepared the loader (``/proc/<pid>/stat``: gone or a zombie means dead)
and exits if it died. The owner is looked at, not the parent, so a forkserver's workers (whose
parent is the server) are judged rightly too. Linux only; elsewhere the user's function runs alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def _process_ended(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return os.path.isdir("/proc/self")  # no such process (where /proc exists at all)
    return state in (b"Z", b"X", b"x")


class OrphanedWorkerGuard:
    """``worker_init_fn`` of a prepared loader: ends the worker when the process that prepared it died.

    user_fn: the loader's own ``worker_init_fn`` (or None), called in between the two looks.
    """

    def __init__(self, user_fn: Callable[[int], Any] | None) -> None:
        self.user_fn = user_fn
        self.owner_pid = os.getpid()

    def _exit_if_orphaned(self) -> None:
        if _process_ended(self.owner_pid):
            os._exit(1)  # nobody reads this worker's results any more; no cleanup to run in a forked child

    def __call__(self, worker_id: int) -> None:
        self._exit_if_orphaned()
        if self.user_fn is not None:
            self.user_fn(worker_id)
        self._exit_if_orphaned()  # torch notes the parent after this function returns


def guarded(worker_init_fn: Callable[[int], Any] | None) -> Callable[[int], Any]:
    """``worker_init_fn`` wrapped once (a loader derived from a prepared one keeps its guard)."""
    if isinstance(worker_init_fn, OrphanedWorkerGuard):
        return worker_init_fn
    return OrphanedWorkerGuard(worker_init_fn)
