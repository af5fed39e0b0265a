"""The check harness itself (checklist.py, checkrun.py): pytest reports one test per check, a failing check by its
name and message, a skipped one as skipped, and the checks after them still run; a failure that leaves a peer in a
collective aborts the run within the sync timeout instead of hanging, naming the check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from checkrun import REPO, checks_in
from nodes import accel_command
from processes import kill_tree

SELFTEST = Path(__file__).resolve().parent / "selftest"


def test_checks_are_read_from_the_source_in_order() -> None:
    assert checks_in(SELFTEST / "demo_checks.py") == [
        "first_passes",
        "fails_on_rank_1",
        "raises_on_every_rank",
        "skipped_on_every_rank",
        "runs_after_the_failures",
        "run_ends_cleanly",  # every rank reached the end, and the launch's exit code says a check failed
    ]
    with pytest.raises(ValueError, match="no @check"):
        checks_in(Path(__file__))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_each_check_is_a_test_and_a_failed_one_hides_none_after_it(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--basetemp={tmp_path / 'inner'}",
            f"--junitxml={report}",
            str(SELFTEST / "demo_checks_suite.py"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    cases = {case.get("name"): case for case in ET.parse(report).getroot().iter("testcase")}
    outcomes = {
        name: next((kind for kind in ("failure", "skipped") if case.find(kind) is not None), "passed")
        for name, case in cases.items()
    }
    assert outcomes == {
        "test_check[first_passes]": "passed",
        "test_check[fails_on_rank_1]": "failure",
        "test_check[raises_on_every_rank]": "failure",
        "test_check[skipped_on_every_rank]": "skipped",
        "test_check[runs_after_the_failures]": "passed",
        "test_check[run_ends_cleanly]": "passed",
    }, result.stdout[-4000:]
    one_rank = cases["test_check[fails_on_rank_1]"].find("failure").text or ""  # type: ignore[union-attr]
    assert "check fails_on_rank_1 of demo_checks.py failed" in one_rank
    assert "--- rank 1: rank 1 disagrees: the sum is 1" in one_rank and "--- rank 0" not in one_rank
    assert "demo_checks.py:35 in fails_on_rank_1" in one_rank
    every_rank = cases["test_check[raises_on_every_rank]"].find("failure").text or ""  # type: ignore[union-attr]
    assert "--- rank 0: ValueError: not a number" in every_rank and "--- rank 1: ValueError: not a number" in every_rank
    assert result.returncode == 1


def test_a_failure_before_a_peers_collective_aborts_the_run_naming_the_check(torchrun_checks) -> None:
    script = SELFTEST / "abort_checks.py"
    started = time.monotonic()
    run = torchrun_checks(script, env={"CHECK_SYNC_TIMEOUT": "3"}, timeout=120)
    assert time.monotonic() - started < 100, "the launch waited for its timeout: a hang"
    assert run.launched.returncode != 0 and not run.launched.timed_out
    assert run.failures("first_passes") == {}
    failed = run.failures("fails_before_a_collective")
    assert failed[1].startswith("rank 1 fails before the all_reduce rank 0 waits in"), failed
    # Rank 0 is stopped in its all_reduce: killed by the launcher, or (first) told by gloo that its peer is gone.
    assert failed[0].startswith("started but did not finish: rank(s) [0] did not finish fails_before_a_collective") or (
        "rank 1 aborted the run here: rank(s) [0] did not finish fails_before_a_collective" in failed[0]
    ), failed
    never = run.failures("never_reached")
    assert set(never) == {0, 1} and all(
        why.startswith("not run: the run was aborted at check fails_before_a_collective") for why in never.values()
    ), never
    with pytest.raises(AssertionError, match=r"check fails_before_a_collective of abort_checks\.py failed"):
        run.assert_passed("fails_before_a_collective")
    assert set(run.failures("run_ends_cleanly")) == {0, 1}  # neither rank reached the end of run_checks


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_given_up_launch_ends_with_all_its_processes_and_its_pipes_close(tmp_path: Path) -> None:
    """A launch's workers run in sessions of their own and die with the launcher (accel_launch.lifeline), but what
    they start (a DataLoader's workers, here a plain child) does not, and it holds the launcher's output pipes: a
    test reading them after killing the launcher (subprocess.run after its timeout) never ends. kill_tree ends it."""
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import os, pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "pathlib.Path(sys.argv[1], os.environ['RANK']).write_text(f'{os.getpid()} {child.pid}')\n"
        "time.sleep(600)\n"
    )
    launcher = subprocess.Popen(
        [*accel_command(), "launch", "--cpu", "-n", "2", str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / rank).exists() for rank in "01"):
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate(timeout=30)
            time.sleep(0.2)
        time.sleep(0.2)  # both lines written in full
        started = [int(pid) for rank in "01" for pid in (tmp_path / rank).read_text().split()]
        # Out of reach of a kill of the launcher's process group: each worker leads a session of its own.
        assert all(os.getsid(pid) != os.getsid(launcher.pid) for pid in started)
    finally:
        kill_tree(launcher.pid)
    launcher.communicate(timeout=30)  # the pipes closed: no process holds them any more
    assert launcher.returncode == -signal.SIGKILL
    psutil.wait_procs([psutil.Process(pid) for pid in started if psutil.pid_exists(pid)], timeout=10)
    assert not [pid for pid in started if psutil.pid_exists(pid)]
