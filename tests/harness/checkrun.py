"""The pytest side of the multi-process check harness: find a script's checks, launch it, report each check.

A test module launches its script once (a module-scoped fixture) and asks for one test per check::

    SCRIPT = HERE / "mp_checks.py"

    @pytest.fixture(scope="module")
    def checks_run(torchrun_checks):
        return torchrun_checks(SCRIPT)

    @pytest.mark.parametrize("name", checks_in(SCRIPT))
    def test_check(checks_run, name):
        checks_run.assert_passed(name)

``checks_in`` reads the script's ``@check`` functions from its source (no torch import at collection); each test
asserts that its check passed on every rank and shows that check's message, place and traceback where it did not.
The worker side is tests/harness/checklist.py; ``torchrun_checks`` and ``torchrun`` are fixtures of
tests/conftest.py built on ``launch`` and ``torchrun_command`` here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from checklist import RESULTS_ENV
from processes import kill_tree

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(__file__).resolve().parent


# The test that follows a script's checks: every rank reached the end of run_checks (teardown included) and the launch
# exited as the checks say (0, or 1 after a failed check), as a plain torchrun launch's exit code was checked before.
ENDED = "run_ends_cleanly"


def checks_in(script: str | Path) -> list[str]:
    """The tests of ``script``: its checks in the order it runs them (its top-level functions decorated ``@check``),
    then ``ENDED``."""
    return [*declared_checks(script), ENDED]


def declared_checks(script: str | Path) -> list[str]:
    """The names of ``script``'s checks in the order it runs them: its top-level functions decorated ``@check``."""
    tree = ast.parse(Path(script).read_text(encoding="utf-8"))
    names = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(d, ast.Name) and d.id == "check" for d in node.decorator_list)
    ]
    if not names:
        raise ValueError(f"{script} defines no @check function")
    return names


def worker_env(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a launched test process: ``base`` (this process's environment by default), CPU only, one
    OpenMP thread per process (2 shared cores), and this folder on ``PYTHONPATH`` so the script can import
    ``checklist``; then ``extra``."""
    base = dict(os.environ) if base is None else base
    path = os.pathsep.join(p for p in (str(HARNESS), base.get("PYTHONPATH", "")) if p)
    return {**base, "ACCEL_USE_CPU": "true", "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(extra or {})}


def rendezvous_args() -> list[str]:
    """torchrun options for a job on this host whose port torchrun picks and holds itself.

    A c10d rendezvous on port 0 binds a free port and keeps it (as ``--standalone`` does), where
    picking a free port here and releasing it for torchrun left a window for another job to take
    it. ``--local-addr`` keeps the workers on the loopback address instead of the host's FQDN.
    """
    return ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1", f"--rdzv-id={uuid.uuid4()}"]


def torchrun_command(script: str | Path, *args: str, nproc: int = 2, python: str = sys.executable) -> list[str]:
    return [python, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *rendezvous_args(), str(script), *args]


@dataclass
class Launched:
    """A finished (or, with ``timed_out``, killed) launch."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    timeout: float


def launch(command: list[str], env: dict[str, str], timeout: float, cwd: Path = REPO) -> Launched:
    """Runs ``command`` in its own session (from the repository root by default); on timeout kills it and every
    process below it (torchrun and its workers alike, so no worker outlives the test: processes.kill_tree) and
    returns what it printed."""
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        stdout, stderr = process.communicate()
        timed_out = True
    return Launched(command, process.returncode, stdout, stderr, timed_out, timeout)


@dataclass
class CheckRun:
    """One launch of a check script: every rank's records (tests/harness/checklist.py writes them), by check."""

    script: Path
    names: list[str]
    nproc: int
    launched: Launched
    records: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def read(
        cls, script: Path, nproc: int, launched: Launched, folder: Path, names: list[str] | None = None
    ) -> CheckRun:
        """``names``: the checks the launch runs, when ``script`` is a driver that imports other scripts' checks
        (``declared_checks`` of each, in the order it imports them); by default ``script``'s own."""
        records = {}
        for rank in range(nproc):
            path = folder / f"rank{rank}.jsonl"
            lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
            records[rank] = [json.loads(line) for line in lines if line.strip()]
        return cls(script, declared_checks(script) if names is None else names, nproc, launched, records)

    def outcome(self, name: str, rank: int) -> str | None:
        """None when ``name`` passed on ``rank``, else why not (its message, place and traceback)."""
        if name == ENDED:
            return self._ending(rank)
        mine = self.records[rank]
        registered = next((r["checks"] for r in mine if r["event"] == "registered"), None)
        if registered is not None and registered != self.names:
            return f"the script ran the checks {registered}, but its source declares {self.names}"
        aborts = [r for rank_records in self.records.values() for r in rank_records if r["event"] == "abort"]
        ended = next((r for r in mine if r["event"] == "end" and r["check"] == name), None)
        if ended is not None:
            if ended["passed"]:
                return None
            aborted = [a for a in aborts if a["check"] == name and a["rank"] != rank]
            # A peer's abort stops this rank's collective too (e.g. gloo's "Connection closed by peer"): say so.
            cause = f"\n  (rank {aborted[0]['rank']} aborted the run here: {aborted[0]['reason']})" if aborted else ""
            return f"{ended['error']}{cause}\n  at {ended['where']}\n{ended['trace']}"
        started = any(r["event"] == "start" and r["check"] == name for r in mine)
        if started:
            why = aborts[0]["reason"] if aborts else self._how_it_ended()
            return f"started but did not finish: {why}"
        if aborts:
            return f"not run: the run was aborted at check {aborts[0]['check']}: {aborts[0]['reason']}"
        return f"not run: {self._how_it_ended()}"

    def _ending(self, rank: int) -> str | None:
        done = next((r for r in self.records[rank] if r["event"] == "done"), None)
        if done is None:
            return f"this rank did not reach the end of run_checks: {self._how_it_ended()}"
        any_failed = any(r["any_failed"] for records in self.records.values() for r in records if r["event"] == "done")
        if self.launched.returncode != int(any_failed):
            return f"the launch exited with code {self.launched.returncode} after the checks ({any_failed=})"
        return None

    def _how_it_ended(self) -> str:
        launched = self.launched
        if launched.timed_out:
            return f"the launch did not finish within {launched.timeout:.0f} s (a hang?) and was killed"
        return f"the launch ended with exit code {launched.returncode} before reaching it"

    def failures(self, name: str) -> dict[int, str]:
        return {rank: why for rank in range(self.nproc) if (why := self.outcome(name, rank)) is not None}

    def skipped(self, name: str) -> str | None:
        """Why ``name`` was skipped, when every rank skipped it (``checklist.skip``)."""
        reasons = {
            r.get("skipped")
            for rank_records in self.records.values()
            for r in rank_records
            if r["event"] == "end" and r["check"] == name
        }
        ended = sum(1 for rank in range(self.nproc) if self.outcome(name, rank) is None)
        return reasons.pop() if ended == self.nproc and len(reasons) == 1 and None not in reasons else None

    def assert_passed(self, name: str) -> None:
        """Fails (pytest's assertion) unless check ``name`` passed on every rank, with each rank's reason; skips the
        test when every rank skipped the check."""
        failures = self.failures(name)
        if not failures:
            if (reason := self.skipped(name)) is not None:
                pytest.skip(f"check {name}: {reason}")
            return
        report = "\n".join(f"--- rank {rank}: {why}" for rank, why in failures.items())
        if name == ENDED or any(why.startswith(("not run", "started")) for why in failures.values()):
            report += f"\n--- stdout (tail):\n{self.launched.stdout[-3000:]}\n--- stderr (tail):\n"
            report += self.launched.stderr[-6000:]
        raise AssertionError(f"check {name} of {self.script.name} failed:\n{report}")

    @property
    def stdout(self) -> str:
        return self.launched.stdout


def run_check_script(
    command: list[str],
    script: str | Path,
    *,
    nproc: int,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    results: Path | None = None,
    base_env: dict[str, str] | None = None,
    names: list[str] | None = None,
) -> CheckRun:
    """Runs ``command`` (which starts ``script`` on ``nproc`` processes: torchrun, ``accel launch`` or ``python``)
    with its records written to ``results`` (a fresh folder when None) and reads them back; the environment is
    ``worker_env(env, base_env)``; ``names`` as in ``CheckRun.read``."""
    folder = Path(tempfile.mkdtemp(prefix="accel-checks-")) if results is None else results
    folder.mkdir(parents=True, exist_ok=True)
    launched = launch(command, worker_env({**(env or {}), RESULTS_ENV: str(folder)}, base_env), timeout)
    return CheckRun.read(Path(script), nproc, launched, folder, names)
