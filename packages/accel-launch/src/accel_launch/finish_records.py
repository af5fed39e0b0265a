"""Which ranks ended cleanly, and when: what a failure summary needs when a rank stops early.

A worker whose script returns (or calls ``sys.exit(0)``) is a success to torchrun's agent, which
reports only the failed ones. When such a rank still had collectives ahead, its peers fail a moment
later ("Connection closed by peer") and would be blamed alone. ``accel launch`` gives its workers a
folder (``ACCEL_FINISH_RECORDS``); the runner writes one small file there per rank and attempt, the
moment the script ended. No torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

FINISH_RECORDS = "ACCEL_FINISH_RECORDS"


@dataclass(frozen=True)
class FinishedRank:
    """A worker whose script ended with exit code 0."""

    rank: int
    local_rank: int
    pid: int
    attempt: int
    finished_at: float  # time.time() when its script returned

    def describe(self) -> str:
        return f"rank {self.rank} (local rank {self.local_rank}, pid {self.pid})"


def record_finish() -> None:
    """Notes that this worker's script ended with exit code 0 (only under ``accel launch``; never raises)."""
    folder = os.environ.get(FINISH_RECORDS)
    rank = os.environ.get("RANK")
    if not folder or rank is None:
        return
    record = {
        "rank": int(rank),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "pid": os.getpid(),
        "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "finished_at": time.time(),
    }
    with contextlib.suppress(OSError):  # a note for a failure message: the job itself succeeded
        Path(folder, f"attempt{record['attempt']}_rank{rank}.json").write_text(json.dumps(record))


def read_finishes(folder: str | os.PathLike[str], attempt: int) -> list[FinishedRank]:
    """The ranks of ``attempt`` that recorded a clean end, lowest rank first.

    attempt: the one that failed; the agent gives up in attempt ``max_restarts`` (the restarts all spent).
    """
    found: list[FinishedRank] = []
    for path in Path(folder).glob(f"attempt{attempt}_rank*.json"):
        try:
            found.append(FinishedRank(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda f: f.rank)
