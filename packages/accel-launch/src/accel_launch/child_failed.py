"""The error ``notebook_launcher`` and ``debug_launcher`` raise: torch's ``ChildFailedError``, told briefly.

Scripts written for Accelerate catch torch's ``ChildFailedError`` around ``notebook_launcher``;
accel's own code catches ``JobFailedError``. ``LaunchedFunctionFailed`` is both. Imports torch:
load it only where torch's agent already ran.
"""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from .failures import JobFailedError, rank_failures_of


class LaunchedFunctionFailed(JobFailedError, ChildFailedError):
    """A launched function failed on some rank.

    ``str()`` is accel's summary (the failing rank and its traceback); ``failures`` / ``name`` /
    ``get_first_failure()`` are torch's ``ChildFailedError``'s; ``root`` and ``exit_code`` accel's.
    """

    def __init__(
        self,
        error: ChildFailedError,
        world_size: int | None = None,
        restarts: int = 0,
        monitor_interval: float | None = None,
    ) -> None:
        JobFailedError.__init__(
            self, rank_failures_of(error), world_size=world_size, restarts=restarts, monitor_interval=monitor_interval
        )
        self.name = error.name
        self.failures = error.failures  # torch's layout: global rank -> ProcessFailure

    def __str__(self) -> str:
        return self.summary()
