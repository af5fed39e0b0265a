"""The stall report sees a rank that stops anywhere, not only in accel's collectives.

Rank 1 SIGSTOPs itself inside a training step (stall_in_backward.py) while rank 0 waits in the gradient all-reduce
that torch's DDP runs inside ``backward``: no accel collective is involved. The report must name rank 1, its pid,
and that its process is alive but stopped, soon after the threshold; the job must go on once rank 1 gets SIGCONT.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from nodes import accel_command
from processes import kill_tree

SCRIPT = Path(__file__).resolve().parent / "stall_in_backward.py"
THRESHOLD = 3.0


def _launch_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _wait_for(predicate, timeout: float, what: str, describe) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s:\n{describe()}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_rank_stopped_inside_a_step_is_named_while_its_peer_waits_in_ddps_backward(tmp_path: Path) -> None:
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    flags = ["--cpu", "-n", "2", "--stall-report-after", str(THRESHOLD), "--collective-timeout", "120"]
    command = [*accel_command(), "launch", *flags, str(SCRIPT), str(tmp_path), "3"]
    with out.open("w") as stdout, err.open("w") as stderr:
        job = subprocess.Popen(command, env=_launch_env(), stdout=stdout, stderr=stderr, start_new_session=True)

    def describe() -> str:
        return f"--- stdout\n{out.read_text()[-4000:]}\n--- stderr\n{err.read_text()[-6000:]}"

    try:
        stopped_at = tmp_path / "stopped_at"
        _wait_for(stopped_at.exists, 240, "rank 1 did not stop", describe)
        _wait_for(lambda: "hold it up" in err.read_text(), 60, "no stall report", describe)
        reported_after = time.time() - float(stopped_at.read_text())
        pid1 = int((tmp_path / "pid1").read_text())
        report = err.read_text()
        report = report[report.index("accel: stall report") :]
        assert report.startswith("accel: stall report from rank 0: it has made no progress for "), describe()
        head = report.splitlines()[0]
        assert re.search(r"no progress for \d+ s, in backward #4\b", head), describe()
        # Where rank 0 waits: the script's line, then torch's own backward (DDP's all-reduce is not accel's).
        backward_line = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "LINE: backward" in line)
        assert f"stall_in_backward.py:{backward_line} in <module>: accelerator.backward(loss)" in report, describe()
        assert "in backward" in report and "torch" in report, describe()
        assert "1 rank(s) hold it up:" in report, describe()
        assert (
            f"- rank 1 (pid {pid1} on {os.uname().nodename}, 127.0.0.1): does not answer; its process is alive but "
            f"stopped (state T: SIGSTOP, SIGTSTP or a debugger; `kill -CONT {pid1}` lets it go on)" in report
        ), describe()
        assert "fails when it has waited 120 s (accel launch --collective-timeout)" in report, describe()
        # The threshold, one poll (a quarter of it), the others' answers awaited (two polls and 1 s), and slack for
        # a loaded 2-core machine.
        assert reported_after < THRESHOLD + 0.75 + 2.5 + 6, f"reported {reported_after:.1f} s after the stop"
        assert err.read_text().count("accel: stall report") == 1, describe()
        os.kill(pid1, signal.SIGCONT)  # the report stopped nothing: the job goes on
        assert job.wait(120) == 0, describe()
        assert "rank 0 done 6 steps" in out.read_text() and "rank 1 done 6 steps" in out.read_text(), describe()
        print(f"reported {reported_after:.1f} s after rank 1 stopped (threshold {THRESHOLD} s)")
    finally:
        pid_file = tmp_path / "pid1"
        if pid_file.exists():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGCONT)
        kill_tree(job.pid)
        job.wait()
    for rank in range(2):  # no worker is left behind, stopped or not
        pid = int((tmp_path / f"pid{rank}").read_text())
        with contextlib.suppress(ProcessLookupError):
            _wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 15, f"rank {rank} still runs", describe)
