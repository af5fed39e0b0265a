"""Fast checks of failure semantics and cluster environments: which rank is the root cause, the summary,
the collective timeout's sources, a port in use, each launcher's variables read as a job, and the folders
of killed launchers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import processes  # tests/harness
import pytest

from accel_core import cluster_env
from accel_launch.failures import JobFailedError, RankFailure
from accel_launch.finish_records import (
    FINISH_RECORDS,
    FOLDER_PREFIX,
    FinishedRank,
    read_finishes,
    record_finish,
    records_folder,
    remove_stale_folders,
)
from accel_launch.plan import LaunchTarget, resolve_plan, torchrun_argv


def _failure(
    rank: int,
    exitcode: int,
    timestamp: int = 100,
    traceback: str | None = None,
    failed_at: float | None = None,
    order: int = 0,
) -> RankFailure:
    return RankFailure(rank, rank, exitcode, 1000 + rank, timestamp, traceback, failed_at, order)


GLOO_CLOSED = (
    "Traceback (most recent call last):\n"
    '  File "/job/train.py", line 9, in <module>\n'
    "    dist.barrier()\n"
    "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:4242.\n"
)


def test_a_sigkilled_rank_is_the_cause_not_the_rank_the_launcher_then_stopped() -> None:
    # What the agent reports after the out-of-memory killer took rank 1: rank 0 stopped with SIGTERM,
    # both seen in the same second, rank 0 first in its report.
    error = JobFailedError(
        [_failure(0, -signal.SIGTERM.value, order=0), _failure(1, -signal.SIGKILL.value, order=1)], world_size=2
    )
    assert error.root.rank == 1 and error.exit_code == 128 + signal.SIGKILL.value
    assert str(error).startswith("The job failed: rank 1 (local rank 1, pid 1001) was killed by SIGKILL.")


def test_a_rank_that_raised_because_its_peer_vanished_is_not_blamed() -> None:
    # Rank 0 waited in a collective; rank 1 was SIGKILLed; rank 0 raised "Connection closed by peer" a moment later
    # (with an exact time) and the agent stopped it while it was exiting.
    rank0 = _failure(0, -signal.SIGTERM.value, traceback=GLOO_CLOSED, failed_at=100.3, order=0)
    rank1 = _failure(1, -signal.SIGKILL.value, timestamp=100, order=1)
    error = JobFailedError([rank0, rank1], world_size=2)
    assert error.root.rank == 1 and error.exit_code == 137
    assert "Also failed: rank 0 (local rank 0, pid 1000) raised an error and was then killed by SIGTERM." in str(error)
    # rank 1 called sys.exit(3) (recorded at 100.25), rank 0 raised 50 ms later: times decide, not the report's order.
    exit3 = _failure(1, 3, traceback="Traceback ...\nSystemExit: 3\n", failed_at=100.25, order=1)
    raised = _failure(0, 1, traceback=GLOO_CLOSED, failed_at=100.30, order=0)
    error = JobFailedError([raised, exit3], world_size=2, tracebacks_printed=True)
    assert error.root.rank == 1 and error.exit_code == 3
    assert "Traceback of rank 1:" in str(error) and "SystemExit: 3" in str(error)  # Python does not print it itself


def test_a_rank_that_ended_cleanly_before_its_peer_failed_is_named() -> None:
    # Rank 1's script returned at 100.1 while rank 0 waited in an all_reduce; rank 0 raised at 100.3.
    raised = _failure(0, 1, traceback=GLOO_CLOSED, failed_at=100.3)
    early = FinishedRank(rank=1, local_rank=1, pid=1001, attempt=0, finished_at=100.1)
    error = JobFailedError([raised], world_size=2, tracebacks_printed=True, finished=[early])
    assert error.root.rank == 0 and error.exit_code == 1 and error.finished_early == [early]
    lines = str(error).splitlines()
    assert lines[0] == "The job failed: rank 0 (local rank 0, pid 1000) exited with code 1."
    assert lines[1].startswith(
        "Before that, rank 1 (local rank 1, pid 1001) had already ended: its script returned (exit code 0) while the "
        "other ranks still ran."
    )
    # A rank that ended after the failure (it finished its work; the failure was elsewhere) is no cause.
    late = FinishedRank(rank=1, local_rank=1, pid=1001, attempt=0, finished_at=100.5)
    error = JobFailedError([raised], world_size=2, finished=[late])
    assert error.finished_early == [] and "had already ended" not in str(error)


def test_finish_records_are_read_for_the_attempt_that_failed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FINISH_RECORDS, str(tmp_path))
    for attempt, rank in ((0, 1), (1, 0)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
        record_finish()
    (record,) = read_finishes(tmp_path, attempt=1)
    assert (record.rank, record.attempt) == (0, 1) and abs(record.finished_at - time.time()) < 60
    assert [r.rank for r in read_finishes(tmp_path, attempt=0)] == [1]
    assert read_finishes(tmp_path, attempt=2) == []


def test_an_error_certainly_earlier_than_a_signal_is_the_cause() -> None:
    # Rank 0 raised at 90.0; rank 1 was seen dead (SIGKILL) in the second 100: it died after 98.9 at the earliest.
    first = _failure(0, 1, traceback=GLOO_CLOSED, failed_at=90.0, order=1)
    later = _failure(1, -signal.SIGKILL.value, timestamp=100, order=0)
    assert JobFailedError([later, first]).root.rank == 0
    # Within the uncertainty of the agent's whole-second timestamp, the signal goes first.
    close = _failure(0, 1, traceback=GLOO_CLOSED, failed_at=99.5, order=1)
    assert JobFailedError([later, close]).root.rank == 1


def test_a_printed_traceback_is_named_not_repeated_and_a_collective_timeout_names_the_absent_rank() -> None:
    timeout = (
        "Traceback (most recent call last):\n"
        '  File "/job/train.py", line 13, in <module>\n'
        "    accelerator.wait_for_everyone()\n"
        '  File "/x/accel_core/state.py", line 170, in wait_for_everyone\n'
        "    dist.barrier()\n"
        "RuntimeError: [unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete\n"
    )
    error = JobFailedError(
        [_failure(0, 1, traceback=timeout, failed_at=100.0), _failure(1, -signal.SIGTERM.value, order=1)],
        world_size=2,
        tracebacks_printed=True,
    )
    text = str(error)
    assert "Traceback (most recent call last)" not in text  # the worker printed it already
    assert "Rank 0: RuntimeError: [unbound_buffer.cc:78] Timed out waiting 5000ms" in text
    assert "/x/accel_core/state.py:170 in wait_for_everyone: dist.barrier()" in text
    assert "Rank 0 timed out waiting in a collective: rank(s) 1, still running when it gave up, never joined" in text
    assert "--collective-timeout" in text
    # Not printed by the worker (notebook_launcher's functions): the summary shows the traceback.
    assert "Traceback of rank 0:" in str(JobFailedError([_failure(0, 1, traceback=timeout, failed_at=1.0)]))


def test_collective_timeout_comes_from_the_script_then_the_launcher_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accel_core import InitProcessGroupKwargs
    from accel_core.state import collective_timeout

    monkeypatch.delenv("ACCEL_COLLECTIVE_TIMEOUT", raising=False)
    assert collective_timeout() == timedelta(minutes=30)
    monkeypatch.setenv("ACCEL_COLLECTIVE_TIMEOUT", "7.5")
    assert collective_timeout() == timedelta(seconds=7.5)
    assert collective_timeout(InitProcessGroupKwargs().to_kwargs()["timeout"]) == timedelta(seconds=7.5)
    given = InitProcessGroupKwargs(timeout=timedelta(seconds=20)).to_kwargs()["timeout"]
    assert collective_timeout(given) == timedelta(seconds=20)
    monkeypatch.setenv("ACCEL_COLLECTIVE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="ACCEL_COLLECTIVE_TIMEOUT='soon' must be a positive number of seconds"):
        collective_timeout()
    plan = resolve_plan({"num_processes": 2, "collective_timeout": 5.0}, {}, {})
    assert plan.env["ACCEL_COLLECTIVE_TIMEOUT"] == "5.0"
    with pytest.raises(ValueError, match="--collective-timeout: collective_timeout must be a positive"):
        resolve_plan({"collective_timeout": 0.0}, {}, {})


def test_port_zero_means_a_free_port_on_one_machine_only() -> None:
    plan = resolve_plan({"num_processes": 2, "main_process_port": 0}, {}, {})
    assert plan.main_process_port is None
    assert not any(arg.startswith("--master-port") for arg in torchrun_argv(plan, LaunchTarget("t.py")))
    with pytest.raises(ValueError, match="0 \\(a free port\\) works on one machine only"):
        resolve_plan({"num_processes": 4, "num_machines": 2, "main_process_ip": "h", "main_process_port": 0}, {}, {})


def test_a_port_in_use_is_one_clear_line(cli) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        start = time.monotonic()
        result = cli.run(
            "launch", "--cpu", "-n", "2", "--main-process-port", str(port), str(cli.scripts / "report_rank.py")
        )
    assert result.returncode == 2, cli.describe(result)
    assert result.stderr.strip().splitlines() == [
        f"accel launch: error: --main-process-port {port} is already in use on this machine (another job, or one "
        "still ending). Pass another port or leave --main-process-port out (or pass 0) to get a free one."
    ]
    assert time.monotonic() - start < 60  # refused before any worker started


@pytest.mark.slow
def test_a_port_taken_after_the_check_is_the_same_clear_error(cli) -> None:
    # Two jobs started together with one --main-process-port both pass check_port_free before either listens. The
    # later agent must fail at once, as the store's host, with the same message: before, torch joined the other
    # job's store as a client, waited for that job to end, then failed with an 80-line connection error.
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        script = [str(cli.scripts / "port_taken_after_check.py"), str(port), str(cli.scripts / "report_rank.py")]
        start = time.monotonic()
        result = processes.run([sys.executable, *script], cli.env(), timeout=60)
    assert result.returncode == 2, cli.describe(result)
    assert result.stderr.strip().splitlines()[-1] == (
        f"accel launch: error: --main-process-port {port} is already in use on this machine (another job, or one "
        "still ending). Pass another port or leave --main-process-port out (or pass 0) to get a free one."
    )
    assert time.monotonic() - start < 30


def test_one_process_output_reaches_a_pipe_before_the_process_is_killed(cli, tmp_path: Path) -> None:
    # The one-process path runs `python -u` as torchrun does: what was printed before the out-of-memory killer's
    # SIGKILL is in the log (it was lost in Python's buffer), and the launcher says what ended the script.
    script = tmp_path / "killed.py"
    script.write_text('import os, signal\nprint("printed before the kill")\nos.kill(os.getpid(), signal.SIGKILL)\n')
    result = cli.run("launch", "--cpu", "-n", "1", str(script))
    assert result.returncode == 137, cli.describe(result)
    assert result.stdout == "printed before the kill\n"
    assert result.stderr.strip() == (
        "accel launch: the script was killed by SIGKILL (exit code 137). No Python traceback (out of memory, a crash "
        "in native code, ...); see its output above."
    )


def test_a_signal_to_the_launchers_whole_group_reaches_a_one_process_script_once(cli) -> None:
    # `timeout`, a CI runner or `kill -- -PGID` signal the launcher's whole process group. The script used to get
    # it twice (directly, and passed on by the launcher): a handler that saves on the first SIGTERM was interrupted
    # by the second. Without a terminal on stdin the child now has a group of its own and gets it once.
    command = [*cli.command(), "launch", "--cpu", "-n", "1", str(cli.scripts / "count_sigterm.py")]
    launcher = subprocess.Popen(
        command,
        env=cli.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the launcher leads its process group, as under `timeout`
    )
    try:
        assert launcher.stdout is not None and launcher.stdout.readline().strip() == "ready"
        os.killpg(launcher.pid, signal.SIGTERM)
        out, _ = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert out.strip() == "SIGTERM received 1 time(s)" and launcher.returncode == 0, (out, launcher.returncode)


def test_slurm_node_lists_expand_in_order() -> None:
    expand = cluster_env.slurm_hostnames
    assert expand("node[01-03],gpu7", use_scontrol=False) == ["node01", "node02", "node03", "gpu7"]
    assert expand("a[1,3-4]-ib,b", use_scontrol=False) == ["a1-ib", "a3-ib", "a4-ib", "b"]
    assert expand("n[008-010]", use_scontrol=False) == ["n008", "n009", "n010"]
    assert expand("solo", use_scontrol=False) == ["solo"]
    assert cluster_env.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


def test_each_launchers_variables_give_the_processs_place() -> None:
    slurm = {
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "123456",
    }
    found = cluster_env.detect(slurm)
    assert found == cluster_env.ClusterEnv("slurm", 5, 8, 1, 4, "gpu07", 15000 + 123456 % 20000)
    # The batch script itself (no srun step) is one process, not rank 0 of SLURM_NTASKS.
    assert cluster_env.detect({"SLURM_NTASKS": "8", "SLURM_PROCID": "0", "SLURM_JOB_ID": "1"}) is None
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    assert cluster_env.detect(ompi) == cluster_env.ClusterEnv("OpenMPI", 1, 2, 1, 2, "127.0.0.1", 29500)
    mpich = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "n1"}
    assert cluster_env.detect(mpich) == cluster_env.ClusterEnv("MPICH", 3, 4, 1, 2, "n1", 29500)
    with pytest.raises(ValueError, match="export MASTER_ADDR=<host of rank 0>"):
        cluster_env.detect({**mpich, "MASTER_ADDR": ""})
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "job-master-0"}
    assert cluster_env.detect({**pod, "MASTER_PORT": "23456"}) == cluster_env.ClusterEnv(
        "kubeflow", 2, 3, 0, 1, "job-master-0", 23456
    )
    # torchrun's variables win (accel launch or torchrun inside an srun step, torchrun inside a pod).
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    assert cluster_env.detect({**slurm, **pod, **torchrun}).launcher == "torchrun"  # type: ignore[union-attr]
    environ = dict(slurm)
    environ.update(cluster_env.torchrun_variables(cluster_env.detect(environ), environ))
    assert {k: environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "gpu07",
    }
    assert cluster_env.detect({}) is None and cluster_env.torchrun_variables(None, {}) == {}


def test_the_launchers_last_look_bounds_a_signal_death_however_late_the_agent_looked() -> None:
    # The agent saw rank 1 dead only in second 105 (a loaded machine); the launcher's watch saw it running at 100.20.
    # Rank 0 raised at 100.25 because rank 1 vanished: rank 1 is the cause.
    late = RankFailure(1, 1, -signal.SIGKILL.value, 1001, 105, None, None, 1, alive_at=100.20)
    raised = _failure(0, 1, timestamp=100, traceback=GLOO_CLOSED, failed_at=100.25, order=0)
    assert JobFailedError([raised, late]).root.rank == 1
    # Without the watch, the agent's late timestamp would have put rank 0 first.
    assert JobFailedError([raised, _failure(1, -signal.SIGKILL.value, timestamp=105, order=1)]).root.rank == 0


@pytest.mark.parametrize("use_pidfds", [True, False], ids=["pidfds", "polled"])
def test_the_exit_watch_sees_a_killed_child_stop_running(use_pidfds: bool) -> None:
    import subprocess

    from accel_launch.exit_watch import ChildExitWatch

    with ChildExitWatch(rescan=0.05, use_pidfds=use_pidfds) as watch:
        child = subprocess.Popen(["sleep", "30"])
        time.sleep(0.5)
        killed_at = time.time()
        child.kill()
        child.wait()
        reaped_at = time.time()
        time.sleep(0.1)
    # SIGKILL lands when the kernel next runs the child, which can be just after kill() returned (seen under
    # load, 0.2 ms late): the last sighting falls between the kill and the reaping.
    assert killed_at - 0.5 < watch.alive_at[child.pid] <= reaped_at


def test_the_exit_watch_looks_when_a_rank_announces_a_failure_or_a_child_ends(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between failures the watch sleeps (here: no look of its own for 60 s). A runner's announcement, then a
    child's end, each wake it, and it sees every other child running after that moment: a rank that dies by a
    signal after a peer failed is then not taken for the cause."""
    import subprocess

    from accel_launch.exit_watch import ChildExitWatch, announce_failure

    monkeypatch.setenv(FINISH_RECORDS, str(tmp_path))
    with ChildExitWatch(fifo_folder=str(tmp_path), rescan=60) as watch:
        time.sleep(0.2)  # the watch's first look, before any child: it now sleeps for 60 s
        first, second = (subprocess.Popen(["sleep", "30"]) for _ in range(2))
        try:
            time.sleep(0.2)
            assert watch.alive_at == {}  # not looked since the children started
            announced_at = time.time()
            announce_failure()  # what the runner does as it records a failure
            time.sleep(0.2)
            assert watch.alive_at.keys() == {first.pid, second.pid}
            assert all(seen > announced_at for seen in watch.alive_at.values()), (announced_at, watch.alive_at)
            looked_at = dict(watch.alive_at)
            first.kill()
            first.wait()
            time.sleep(0.2)
            # Compared within the watch's own stamps, not with this thread's clock: in CI (stop 36) this thread's
            # time.time() after the reap read 50 us below the stamp the watch took as it woke (cause not found; no
            # cross-CPU clock skew measured on this machine, 4 M handoffs).
            assert watch.alive_at[first.pid] == looked_at[first.pid]  # not seen running after it was killed
            # Looked again when first ended (0.2 s after the announcement's look; its own look is 60 s away).
            assert watch.alive_at[second.pid] - looked_at[second.pid] > 0.15
        finally:
            for child in (first, second):
                child.kill()
                child.wait()


def test_a_failure_announced_without_a_launcher_is_dropped(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose launcher is gone (no reader on the FIFO), or that runs outside `accel launch`, neither waits
    nor raises."""
    import os

    from accel_launch.exit_watch import FAILING_FIFO, announce_failure

    monkeypatch.delenv(FINISH_RECORDS, raising=False)
    announce_failure()
    monkeypatch.setenv(FINISH_RECORDS, str(tmp_path))
    announce_failure()  # no FIFO
    os.mkfifo(tmp_path / FAILING_FIFO)
    started = time.monotonic()
    announce_failure()  # a FIFO nobody reads
    assert time.monotonic() - started < 1


def test_stall_report_threshold_comes_from_the_script_then_the_launcher_then_60_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accel_core import InitProcessGroupKwargs
    from accel_core.settings import settle
    from accel_core.stall_report import stall_report_after

    # Read from the run's settled record (the process state's), never from os.environ.
    monkeypatch.setenv("ACCEL_STALL_REPORT_AFTER", "7")
    assert stall_report_after(None, {}) == 60.0
    assert stall_report_after(None, settle({"ACCEL_STALL_REPORT_AFTER": "0"}).environ) == 0.0  # off
    launched = settle({"ACCEL_STALL_REPORT_AFTER": "4.5"}).environ
    assert stall_report_after(InitProcessGroupKwargs().to_kwargs().get("stall_report_after"), launched) == 4.5
    given = InitProcessGroupKwargs(stall_report_after=timedelta(seconds=20)).to_kwargs()["stall_report_after"]
    assert stall_report_after(given, launched) == 20.0
    with pytest.raises(ValueError, match="ACCEL_STALL_REPORT_AFTER='soon': the stall report's threshold must be 0"):
        stall_report_after(None, {"ACCEL_STALL_REPORT_AFTER": "soon"})
    plan = resolve_plan({"num_processes": 2, "stall_report_after": 3.0}, {}, {})
    assert plan.env["ACCEL_STALL_REPORT_AFTER"] == "3.0"
    with pytest.raises(ValueError, match=r"--stall-report-after: stall_report_after must be 0 \(off\) or a number"):
        resolve_plan({"stall_report_after": -1.0}, {}, {})


def test_the_stall_report_names_ranks_that_ended_or_do_not_answer_and_groups_those_waiting_alike() -> None:
    # The live report is checked under `accel launch` (tests/cli/test_fault_jobs.py); here the cases a
    # 2-process gloo job cannot show (a rank that exits or is killed fails gloo's collective at once).
    from accel_core.stall_report import compose_report

    def position(rank: int, state: str, seq: int, op: str = "gather", **more: object) -> dict[str, object]:
        where = {"rank": rank, "answer": 1, "state": state, "seq": seq, "op": op, "via": op, "site": f"train.py:{seq}"}
        return {**where, "since": 61.0, "now": [], "host": "node", "pid": 100 + rank, **more}

    reporter = position(0, "in", 5)
    positions = {
        0: reporter,
        1: position(1, "in", 5),
        2: position(2, "in", 5),
        3: position(3, "exited", 4, op="reduce", via="log_metrics"),
        4: None,
        5: position(5, "out", 4, op="reduce", now=["train.py:30 in loop: batch = next(it)"]),
    }
    report = compose_report(reporter, positions, 6, 1800.0)
    assert report.startswith("accel: stall report from rank 0: it has waited 61 s in gather #5 at train.py:5.")
    assert "3 rank(s) have not reached it:" in report
    assert (
        "- rank 3 (pid 103 on node): its script has ended; its last collective was reduce #4 at train.py:4, "
        "called through log_metrics" in report
    )
    assert "- rank 4: did not answer (its process was killed" in report
    assert (
        "- rank 5 (pid 105 on node): is not in a collective; its last was reduce #4 at train.py:4, 61 s ago; "
        "now at:\n      train.py:30 in loop: batch = next(it)" in report
    )
    assert "In it: rank(s) 0-2." in report
    assert "fails when it has waited 1800 s" in report
    alone = compose_report(reporter, {0: reporter}, 2, None, asked=False)
    assert "- rank 1: position unknown (no rendezvous store at MASTER_ADDR:MASTER_PORT to ask)" in alone


def test_an_error_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank stopped while writing its error file (the agent's SIGTERM, as a KeyboardInterrupt here) must not leave
    a partial file: torch's agent reads it and raised JSONDecodeError on an empty one, ending a job that was to
    restart (seen in CI)."""
    import json

    from accel_launch import runner

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setattr(runner, "announce_failure", lambda: None)
    runner.record_error(ValueError("first"), None)
    assert json.loads(path.read_text())["message"]["message"] == "ValueError: first"

    def stopped_halfway(data, handle) -> None:
        handle.write('{"message": {"mess')
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.json, "dump", stopped_halfway)
    with pytest.raises(KeyboardInterrupt):
        runner.record_error(ValueError("second"), None)
    assert json.loads(path.read_text())["message"]["message"] == "ValueError: first"  # untouched, whole
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]  # no temporary file left behind


def test_record_folders_of_launchers_that_were_killed_are_removed_by_the_next_launch(tmp_path) -> None:
    # A SIGKILLed launcher cannot remove its folder; the next launch removes those whose launcher is gone.
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(ended.stdout)
    stale = tmp_path / f"{FOLDER_PREFIX}{dead_pid}-abc123"
    stale.mkdir()
    os.mkfifo(stale / "failing")
    (stale / "attempt0_rank0.json").write_text("{}")
    running = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-def456"  # this process: still running
    running.mkdir()
    unnamed = tmp_path / f"{FOLDER_PREFIX}q8zodz1o"  # no pid in the name (older accel): not ours to judge
    unnamed.mkdir()
    other = tmp_path / f"other-{dead_pid}-x"
    other.mkdir()
    remove_stale_folders(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, unnamed.name, other.name])


def test_a_launch_names_its_record_folder_after_its_own_pid() -> None:
    with records_folder() as folder:
        assert Path(folder).name.startswith(f"{FOLDER_PREFIX}{os.getpid()}-") and Path(folder).is_dir()
    assert not Path(folder).exists()
