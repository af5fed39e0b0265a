"""A failed job, told briefly: which rank failed first, its exit code and its traceback.

torchrun's agent raises ``ChildFailedError`` with one ``ProcessFailure`` per worker that did not
succeed, including those the agent itself stopped (SIGTERM) after the first failure; this module
picks the root cause and formats it. No torch import at module level.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

# Signals the agent uses to stop the surviving workers: such a worker is a victim, not the cause.
_STOP_SIGNALS = {signal.SIGTERM.value, signal.SIGKILL.value if hasattr(signal, "SIGKILL") else 9}


@dataclass(frozen=True)
class RankFailure:
    """One worker that did not succeed."""

    rank: int
    local_rank: int
    exitcode: int
    pid: int
    timestamp: int
    traceback: str | None  # the Python traceback it recorded, if it raised

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    @property
    def stopped_by_launcher(self) -> bool:
        return self.exitcode < 0 and -self.exitcode in _STOP_SIGNALS

    def describe(self) -> str:
        if self.signal_name:
            return f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}) was killed by {self.signal_name}"
        return f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}) exited with code {self.exitcode}"


class JobFailedError(RuntimeError):
    """A launched job failed; ``str()`` names the failing rank and shows its traceback.

    ``rank_failures`` lists the ranks that did not succeed, root cause first (``root``).
    ``exit_code`` is what the launching command should return: the failing rank's code, or
    ``128 + signal`` when a signal killed it (the shell's convention).
    """

    def __init__(self, failures: list[RankFailure], world_size: int | None = None, restarts: int = 0) -> None:
        if not failures:
            raise ValueError("JobFailedError needs at least one failure.")
        # Root cause: a worker that failed by itself before one the launcher stopped; one with a
        # traceback before one without; then the earliest; then the lowest rank.
        self.rank_failures = sorted(
            failures, key=lambda f: (f.stopped_by_launcher, f.traceback is None, f.timestamp, f.rank)
        )
        self.root = self.rank_failures[0]
        self.world_size = world_size
        self.restarts = restarts
        super().__init__(self.summary())

    @property
    def exit_code(self) -> int:
        code = self.root.exitcode
        return 128 - code if code < 0 else (code or 1)

    def summary(self) -> str:
        root = self.root
        lines = [f"The job failed: {root.describe()}."]
        others = [f for f in self.rank_failures[1:] if not f.stopped_by_launcher]
        if others:
            lines.append("Also failed: " + "; ".join(f.describe() for f in others) + ".")
        if self.restarts:
            lines.append(f"It failed again after {self.restarts} restart(s).")
        if root.traceback:
            lines.append(f"Traceback of rank {root.rank}:")
            lines.append("  " + root.traceback.rstrip().replace("\n", "\n  "))
        elif root.signal_name:
            lines.append(
                "No Python traceback (killed by a signal: out of memory, a crash in native code, ...); see its output "
                "above."
            )
        else:
            lines.append("No Python traceback (it exited without raising, e.g. sys.exit); see its output above.")
        if self.world_size is None or self.world_size > 1:
            lines.append("The other ranks were stopped.")
        return "\n".join(lines)

    @classmethod
    def from_child_failed(cls, error: Any, world_size: int | None = None, restarts: int = 0) -> JobFailedError:
        """Builds the error from torch's ``ChildFailedError`` (``error.failures``: global rank -> ProcessFailure)."""
        return cls(rank_failures_of(error), world_size=world_size, restarts=restarts)


def rank_failures_of(error: Any) -> list[RankFailure]:
    """The ``RankFailure`` of each worker in torch's ``ChildFailedError``."""
    return [
        RankFailure(
            rank=int(rank),
            local_rank=int(failure.local_rank),
            exitcode=int(failure.exitcode),
            pid=int(failure.pid),
            timestamp=int(failure.timestamp),
            traceback=_traceback_of(failure),
        )
        for rank, failure in error.failures.items()
    ]


# Frames of torch's worker wrappers (``record``, the multiprocessing entry) are noise in a user's traceback.
_WRAPPER_PATHS = ("/torch/distributed/elastic/", "/torch/multiprocessing/", "\\torch\\distributed\\elastic\\")


def drop_wrapper_frames(text: str) -> str:
    """Removes the frames of torch's worker wrappers from a formatted traceback."""
    kept: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if line.startswith('  File "'):
            skipping = any(path in line for path in _WRAPPER_PATHS)
        elif not line.startswith("    "):
            skipping = False  # past the frames: the exception line, or a chained traceback's header
        if not skipping:
            kept.append(line)
    return "".join(kept)


def _traceback_of(failure: Any) -> str | None:
    """The traceback a worker wrote to its error file (torch's layout), if any."""
    message = failure.message
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        text = extra.get("py_callstack") or message.get("message")
        return drop_wrapper_frames(text) if text else None
    if getattr(failure, "error_file", "<N/A>") == "<N/A>":
        return None  # torch's placeholder text ("To enable traceback see ...") is not a traceback
    return str(message) or None
