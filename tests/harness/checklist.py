"""The worker side of the multi-process check harness: named checks, every one run and recorded on every rank.

A script launched under torchrun (or plain ``python``) declares its checks as functions and ends with
``run_checks()``::

    from checklist import check, expect, run_checks, skip

    @check
    def gather_returns_every_sample() -> None:
        expect(len(gathered) == 10, f"{len(gathered)} samples")

    @check
    def four_process_layout() -> None:
        if WORLD_SIZE != 4:
            skip("needs 4 processes")  # every check is declared in every launch; pytest reports this one skipped
        ...

    if __name__ == "__main__":
        run_checks()

``run_checks`` runs the checks in the order they are defined, on every rank. A failed ``expect`` (or any exception)
fails that check only: the result (passed or failed, the message, where it was raised, a traceback) is written as a
JSON line to ``$CHECK_RESULTS/rank<N>.jsonl``, and the next check runs. pytest reads those lines and reports
one test per check (tests/harness/checkrun.py). The script exits 1 when a check failed on any rank.

Collectives. All ranks run the same checks in the same order, and after each check every rank waits (through files in
the results folder, never through a collective, which could pair with a collective a peer is still in) until every
rank has finished it. A check that fails on every rank, or after its last collective, leaves the ranks in step and
the run goes on. A check that fails on one rank *before* a collective its peers enter leaves them waiting in that
collective: then the failing rank stops waiting after ``CHECK_SYNC_TIMEOUT`` seconds (default 120), records
that the run was aborted at that check, and exits, and the launcher stops the others. The checks after it are
reported as not run, the failed one by its name and message.

Only the standard library is imported here: the harness also runs in environments holding nothing but the packages
under test (tests/data/isolated_checks.py, launched by tests/packaging/test_wheels.py).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

RESULTS_ENV = "CHECK_RESULTS"
SYNC_TIMEOUT_ENV = "CHECK_SYNC_TIMEOUT"
DEFAULT_SYNC_TIMEOUT = 120.0


class CheckFailed(AssertionError):
    """An ``expect`` that did not hold; its message is the check's failure message."""


def expect(condition: object, message: str) -> None:
    """Fails the running check with ``message`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailed(message)


class CheckSkipped(Exception):
    """Raised by ``skip``: the check does not apply to this launch (e.g. another number of processes)."""


def skip(reason: str) -> None:
    """Ends the running check as skipped; pytest reports it skipped with ``reason`` when every rank skipped it."""
    raise CheckSkipped(reason)


@dataclass(frozen=True)
class Check:
    name: str
    function: Callable[[], None]


_CHECKS: list[Check] = []


def check(function: Callable[[], None]) -> Callable[[], None]:
    """Registers ``function`` (no arguments) as a check named after it; checks run in the order they are defined.

    pytest finds the checks by reading the script (a top-level ``def`` decorated ``@check``), without running it.
    """
    if any(existing.name == function.__name__ for existing in _CHECKS):
        raise ValueError(f"two checks are named {function.__name__}")
    _CHECKS.append(Check(function.__name__, function))
    return function


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _results_folder() -> Path:
    """``$CHECK_RESULTS`` (set by the pytest side), else one folder per torchrun job (its run id) for a run
    started by hand; every rank of a job must agree on it."""
    if folder := os.environ.get(RESULTS_ENV):
        return Path(folder)
    job = os.environ.get("TORCHELASTIC_RUN_ID") if world_size() > 1 else str(os.getpid())
    if job is None:
        raise RuntimeError(f"{world_size()} processes but neither {RESULTS_ENV} nor TORCHELASTIC_RUN_ID is set")
    return Path(tempfile.gettempdir()) / f"accel-checks-{job}"


class _Recorder:
    """Appends this rank's records to ``rank<N>.jsonl`` (flushed per line: a killed run keeps what it recorded) and
    meets the other ranks after each check through marker files ``sync/<index>.<rank>`` holding pass or fail."""

    def __init__(self, folder: Path) -> None:
        self.rank, self.world_size = rank(), world_size()
        self.sync = folder / "sync"
        self.sync.mkdir(parents=True, exist_ok=True)
        self.file = (folder / f"rank{self.rank}.jsonl").open("a", encoding="utf-8")
        self.timeout = float(os.environ.get(SYNC_TIMEOUT_ENV, DEFAULT_SYNC_TIMEOUT))

    def write(self, event: str, **fields: Any) -> None:
        self.file.write(json.dumps({"event": event, "rank": self.rank, **fields}) + "\n")
        self.file.flush()

    def meet(self, index: int, name: str, passed: bool) -> list[int]:
        """Waits until every rank finished check ``index``; the ranks where it failed. Aborts the run (this process
        exits) when a rank does not arrive within the timeout, or when another rank aborted it."""
        (self.sync / f"{index}.{self.rank}").write_text("pass" if passed else "fail")
        aborted = self.sync / "aborted"
        deadline = time.monotonic() + self.timeout
        while True:
            if aborted.exists():  # a peer gave up on this rank or another: its collectives are out of step too
                self.abort(name, f"rank {aborted.read_text()}")
            states = {r: self.sync / f"{index}.{r}" for r in range(self.world_size)}
            missing = [r for r, marker in states.items() if not marker.exists()]
            if not missing:
                return [r for r, marker in states.items() if marker.read_text() == "fail"]
            if time.monotonic() > deadline:
                reason = (
                    f"rank(s) {missing} did not finish {name} within {self.timeout:.0f} s of rank {self.rank} "
                    "(a failed check on one rank left the others in a collective?): the run stops here"
                )
                aborted.write_text(f"{self.rank}: {reason}")
                self.abort(name, reason)
            time.sleep(0.05)

    def abort(self, name: str, reason: str) -> NoReturn:
        self.write("abort", check=name, reason=reason)
        print(f"checks aborted on rank {self.rank} at {name}: {reason}", file=sys.stderr, flush=True)
        os._exit(1)  # the peers are stuck in a collective: no teardown can finish; the launcher stops them


def _summary(error: BaseException) -> tuple[str, str]:
    """(where: the innermost frame outside this module, the traceback's last lines)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != __file__]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"
    lines = "".join(traceback.format_exception(type(error), error, error.__traceback__)).splitlines()
    return where, "\n".join(lines[-40:])


def run_checks(teardown: Callable[[], None] | None = None) -> NoReturn:
    """Runs every registered check on this rank, records each, then ``teardown`` (e.g. destroying the process group)
    and exits: 0 when every check passed on every rank, else 1."""
    recorder = _Recorder(_results_folder())
    recorder.write("registered", checks=[c.name for c in _CHECKS])
    any_failed = False
    for index, item in enumerate(_CHECKS):
        recorder.write("start", check=item.name)
        started = time.perf_counter()
        error: Exception | None = None
        skipped: str | None = None
        try:
            item.function()
        except CheckSkipped as reason:
            skipped = str(reason)
        # Any other exception fails this check only; the run goes on (see the module's docstring).
        except Exception as raised:  # noqa: BLE001
            error = raised
        seconds = round(time.perf_counter() - started, 3)
        if skipped is not None:
            recorder.write("end", check=item.name, passed=True, skipped=skipped, seconds=seconds)
            print(f"check {item.name}: skipped on rank {recorder.rank}: {skipped}", flush=True)
        elif error is None:
            recorder.write("end", check=item.name, passed=True, seconds=seconds)
            print(f"check {item.name}: passed on rank {recorder.rank} ({seconds} s)", flush=True)
        else:
            where, trace = _summary(error)
            message = f"{type(error).__name__}: {error}" if not isinstance(error, CheckFailed) else str(error)
            recorder.write(
                "end", check=item.name, passed=False, seconds=seconds, error=message, where=where, trace=trace
            )
            print(f"check {item.name}: FAILED on rank {recorder.rank} at {where}: {message}", flush=True)
        any_failed = bool(recorder.meet(index, item.name, passed=error is None)) or any_failed
    if teardown is not None:
        teardown()
    recorder.write("done", any_failed=any_failed)
    recorder.file.close()
    sys.exit(1 if any_failed else 0)
