"""A failed job, told briefly: which rank failed first, its exit code and its traceback.

torchrun's agent raises ``ChildFailedError`` with one ``ProcessFailure`` per worker that did not
succeed, including those the agent itself stopped (SIGTERM) after the first failure and those that
failed *because* another rank died (a collective's "Connection closed by peer"); this module picks
the root cause, the earliest failure, and formats it. No torch import at module level.

When each rank failed: a worker started by ``accel launch`` records the time it raised or called
``sys.exit`` with a non-zero code (``runner.record_error``, to the microsecond). A worker killed by a
signal records nothing; it died after the launcher last saw it running (``ChildExitWatch``), or,
without that watch, after the agent's previous look, one monitor interval before its
``ProcessFailure.timestamp`` (whole seconds). A recorded failure goes first only when it is
certainly earlier than that bound, so a rank that raised because an out-of-memory-killed peer
vanished a moment before is not blamed for it, however late a loaded machine let the launcher look.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .finish_records import FinishedRank

# The signal the agent stops the surviving workers with: such a worker is a victim, not the cause.
# SIGKILL is not one: the agent sends it only to a worker that ignored SIGTERM for 30 s, and it is what
# the out-of-memory killer sends, so a SIGKILLed worker is a root-cause candidate, ordered by time.
_STOP_SIGNALS = {signal.SIGTERM.value}

# torchrun's default --monitor-interval: how long a dead worker can go unseen by the agent.
DEFAULT_MONITOR_INTERVAL = 0.1


@dataclass(frozen=True)
class RankFailure:
    """One worker that did not succeed."""

    rank: int
    local_rank: int
    exitcode: int
    pid: int
    timestamp: int  # torch's: when it recorded its error, else when the agent saw it dead (whole seconds)
    traceback: str | None  # the Python traceback it recorded, if it raised (or called sys.exit with a code)
    failed_at: float | None = None  # the precise time accel's runner recorded the failure, if it did
    order: int = 0  # position in the agent's report (it reports the failures it saw first first)
    alive_at: float | None = None  # the last time the launcher saw it running (``ChildExitWatch``), if known

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
        """Killed by the agent's stop signal without having failed first (no recorded error)."""
        return self.exitcode < 0 and -self.exitcode in _STOP_SIGNALS and self.traceback is None

    def describe(self) -> str:
        if self.signal_name and self.traceback is not None:
            # It raised (recorded below), then a signal ended it while it was still exiting.
            return (
                f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}) raised an error and was then "
                f"killed by {self.signal_name}"
            )
        if self.signal_name:
            return f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}) was killed by {self.signal_name}"
        return f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid}) exited with code {self.exitcode}"


class JobFailedError(RuntimeError):
    """A launched job failed; ``str()`` names the failing rank and shows its traceback.

    ``rank_failures`` lists the ranks that did not succeed, root cause first (``root``).
    ``exit_code`` is what the launching command should return: the failing rank's code, or
    ``128 + signal`` when a signal killed it (the shell's convention).
    """

    def __init__(
        self,
        failures: list[RankFailure],
        world_size: int | None = None,
        restarts: int = 0,
        monitor_interval: float | None = None,
        tracebacks_printed: bool = False,
        finished: list[FinishedRank] | None = None,
        unreachable: list[dict[str, Any]] | None = None,
    ) -> None:
        """unreachable: the stall report's notes of a peer that became unreachable (``stall_probe.read_unreachable``):
        a collective timeout after one is a lost link or machine, not a hang."""
        if not failures:
            raise ValueError("JobFailedError needs at least one failure.")
        # A worker the agent saw dead at `timestamp` (floored to the second) died after
        # timestamp - monitor interval, minus the time one poll takes (well under a second).
        slack = 1.0 + (DEFAULT_MONITOR_INTERVAL if monitor_interval is None else monitor_interval)

        def failed_no_later_than(f: RankFailure) -> float:
            if f.failed_at is not None:
                return f.failed_at
            if f.traceback is not None:
                return float(f.timestamp)  # recorded by torch's own `record`: the second it raised
            if f.alive_at is not None:
                return f.alive_at  # a signal or a bare exit: it happened after the launcher last saw it running
            return f.timestamp - slack  # ... or after the agent's previous look, a monitor interval before

        # Root cause: a worker that failed by itself before one the launcher stopped; then the
        # earliest failure; then the order the agent saw them in; then the lowest rank.
        self.rank_failures = sorted(
            failures, key=lambda f: (f.stopped_by_launcher, failed_no_later_than(f), f.order, f.rank)
        )
        self.root = self.rank_failures[0]
        # Ranks whose script had ended cleanly before the root cause failed: their peers' collectives had no partner.
        root_failed = failed_no_later_than(self.root)
        self.finished_early = [f for f in finished or [] if f.finished_at < root_failed]
        self.world_size = world_size
        self.restarts = restarts
        self.tracebacks_printed = tracebacks_printed
        self.unreachable = unreachable or []
        super().__init__(self.summary())

    @property
    def exit_code(self) -> int:
        code = self.root.exitcode
        return 128 - code if code < 0 else (code or 1)

    def summary(self) -> str:
        root = self.root
        lines = [f"The job failed: {root.describe()}."]
        if self.finished_early:
            early = self.finished_early
            names = "; ".join(f.describe() for f in early)
            which = "their scripts" if len(early) > 1 else "its script"
            lines.append(
                f"Before that, {names} had already ended: {which} returned (exit code 0) while the other ranks still "
                'ran. A rank that ends while its peers still call collectives makes those fail ("Connection closed '
                'by peer", a timeout). Check why it stopped early: fewer batches or steps on that rank, a condition '
                "on the rank, an early return or sys.exit(0)."
            )
        others = [f for f in self.rank_failures[1:] if not f.stopped_by_launcher]
        if others:
            lines.append("Also failed: " + "; ".join(f.describe() for f in others) + ".")
        if self.restarts:
            lines.append(f"It failed again after {self.restarts} restart(s).")
        error_line = root.traceback.rstrip().splitlines()[-1] if root.traceback else ""
        if root.traceback and self.tracebacks_printed and not error_line.startswith("SystemExit"):
            # The worker printed it in its output already (Python does, except for sys.exit): once is enough.
            where = _last_frame(root.traceback)
            lines.append(f"Rank {root.rank}: {error_line}" + (f" ({where})" if where else ""))
            lines.append(f"Its full traceback is in rank {root.rank}'s output above.")
        elif root.traceback:
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
        if root.traceback and self.unreachable and _LOST_PEER.search(error_line):
            note = self.unreachable[0]
            lines.append(
                f"Rank {root.rank}'s collective failed because a peer became unreachable, not a hang: "
                f"{note['text']} (seen by rank {note['rank']}'s stall report). Check the network between the "
                "machines, or that machine."
            )
        elif root.traceback and _COLLECTIVE_TIMEOUT.search(error_line):
            waiting = sorted(f.rank for f in self.rank_failures if f.stopped_by_launcher)
            never = f"rank(s) {', '.join(map(str, waiting))}, still running when it gave up," if waiting else "a rank"
            lines.append(
                f"Rank {root.rank} timed out waiting in a collective: {never} never joined it (a hang, or a "
                "collective only some ranks call). The wait is --collective-timeout / "
                "InitProcessGroupKwargs(timeout=...)."
            )
        return "\n".join(lines)

    @classmethod
    def from_child_failed(
        cls,
        error: Any,
        world_size: int | None = None,
        restarts: int = 0,
        monitor_interval: float | None = None,
        tracebacks_printed: bool = False,
        alive_at: Mapping[int, float] | None = None,
        finished: list[FinishedRank] | None = None,
        unreachable: list[dict[str, Any]] | None = None,
    ) -> JobFailedError:
        """Builds the error from torch's ``ChildFailedError`` (``error.failures``: global rank -> ProcessFailure).

        tracebacks_printed: the workers printed their tracebacks (accel's runner does); the summary
            then names the error and where it was raised instead of repeating the traceback.
        """
        return cls(
            rank_failures_of(error, alive_at),
            world_size=world_size,
            restarts=restarts,
            monitor_interval=monitor_interval,
            tracebacks_printed=tracebacks_printed,
            finished=finished,
            unreachable=unreachable,
        )


class RendezvousLostError(RuntimeError):
    """This machine's agent lost the job's rendezvous (a multi-machine job): what happened, without torch's traceback.

    exit_code: 1, as a failed job.
    """

    exit_code = 1

    @classmethod
    def from_error(cls, error: BaseException, endpoint: str, machine_rank: int) -> RendezvousLostError:
        """From torch's ``RendezvousClosedError`` / ``RendezvousConnectionError`` / ``RendezvousTimeoutError``."""
        kind = type(error).__name__
        if kind == "RendezvousClosedError":
            why = (
                "another machine closed the job: its part failed (after its --max-restarts, if any) and it ended the "
                "rendezvous for every machine"
            )
        elif kind == "RendezvousTimeoutError":
            why = "the other machines did not join in time"
        else:
            why = (
                "the machine serving it (machine rank 0) ended its part of the job, or became unreachable from here"
                if machine_rank != 0
                else "its store stopped answering"
            )
        return cls(
            f"The job's rendezvous at {endpoint} is gone ({kind}): {why}. This machine's workers were stopped; why "
            "the job failed is in the other machines' output (above all machine rank 0's summary)."
        )


def rank_failures_of(error: Any, alive_at: Mapping[int, float] | None = None) -> list[RankFailure]:
    """The ``RankFailure`` of each worker in torch's ``ChildFailedError``.

    alive_at: pid -> the last time the launcher saw that worker running (``ChildExitWatch.alive_at``).
    """
    alive_at = alive_at or {}
    return [
        RankFailure(
            rank=int(rank),
            local_rank=int(failure.local_rank),
            exitcode=int(failure.exitcode),
            pid=int(failure.pid),
            timestamp=int(failure.timestamp),
            traceback=_traceback_of(failure),
            failed_at=_failed_at(failure),
            order=order,
            alive_at=alive_at.get(int(failure.pid)),
        )
        for order, (rank, failure) in enumerate(error.failures.items())
    ]


def _failed_at(failure: Any) -> float | None:
    """The precise failure time accel's runner wrote to the error file (``extraInfo.failed_at``), if any."""
    message = getattr(failure, "message", None)
    if not isinstance(message, dict):
        return None
    raw = (message.get("extraInfo") or {}).get("failed_at")
    try:
        return float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


# How gloo ("Timed out waiting 5000ms for recv operation") and NCCL's watchdog ("collective operation
# timeout") report a collective that some rank never joined.
_COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+ ?ms|collective operation timeout|DistTimeoutError", re.I)


# How a collective fails when its peer's machine or link went away: a timeout, or the connection dropped.
_LOST_PEER = re.compile(
    _COLLECTIVE_TIMEOUT.pattern
    + r"|Connection reset|Connection closed|Broken pipe|No route to host|Network is unreachable",
    re.I,
)

_TORCH_PATHS = ("/torch/", "\\torch\\")


def _last_frame(traceback: str) -> str:
    """``file:line in function: code`` of the innermost frame of a formatted traceback, or ``""``."""
    frames = re.findall(r'^\s*File "([^"]+)", line (\d+), in (.+)\n(?:\s{4,}(\S.*)$)?', traceback, re.M)
    # The innermost frame outside torch: where the script (or accel) called into it.
    frames = [f for f in frames if not any(part in f[0] for part in _TORCH_PATHS)] or frames
    if not frames:
        return ""
    path, line, function, code = frames[-1]
    return f"{path}:{line} in {function}" + (f": {code.strip()}" if code else "")


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
