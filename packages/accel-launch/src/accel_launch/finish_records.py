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
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FINISH_RECORDS = "ACCEL_FINISH_RECORDS"
FOLDER_PREFIX = "accel-finished-"  # + the launcher's pid + "-" + tempfile's random part


def records_folder() -> tempfile.TemporaryDirectory[str]:
    """A new folder for this launch's records, named after this process; stale ones are removed first.

    The launcher removes its folder when it ends, unless it is SIGKILLed (a scheduler's hard
    kill, the out-of-memory killer): the pid in the name lets the next launch find those and
    remove them, so killed jobs do not pile up folders in the temporary directory.
    """
    remove_stale_folders(tempfile.gettempdir())
    return tempfile.TemporaryDirectory(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")


def remove_stale_folders(parent: str) -> None:
    """Removes this user's record folders in ``parent`` whose launcher is no longer running (never raises)."""
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith(FOLDER_PREFIX):
                continue
            pid = entry.name[len(FOLDER_PREFIX) :].partition("-")[0]
            with contextlib.suppress(OSError):
                if not pid.isdigit() or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                if not entry.is_dir(follow_symlinks=False) or _running(int(pid)):
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process holds that pid now
        return True
    return True


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
