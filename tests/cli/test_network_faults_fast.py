"""The texts a user sees when the network breaks, checked without processes (the live runs: tests/faults).

A collective that timed out after the stall report found a peer unreachable is blamed on the network, not a hang;
a lost rendezvous is one line; a loopback host name on a multi-machine job is refused with the fix; the progress
report says nothing when every rank answered at the same step.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

from accel_core import network_check
from accel_core.stall_probe import probe_store, read_unreachable, record_unreachable
from accel_core.stall_text import compose_progress_report
from accel_launch.failures import JobFailedError, RankFailure, RendezvousLostError

TIMED_OUT = (
    "Traceback (most recent call last):\n"
    '  File "/job/train.py", line 9, in <module>\n'
    "    accelerator.backward(loss)\n"
    "RuntimeError: [unbound_buffer.cc:78] Timed out waiting 25000ms for recv operation to complete\n"
)


def test_a_collective_timeout_after_a_peer_became_unreachable_blames_the_network(tmp_path) -> None:
    record_unreachable(
        0,
        "rank 1 (pid 7 on node-b, 10.0.0.2) became unreachable: node-b (10.0.0.2) does not answer",
        {"ACCEL_FINISH_RECORDS": str(tmp_path)},  # the run's settled record
    )
    notes = read_unreachable(str(tmp_path))
    assert [note["rank"] for note in notes] == [0]
    failure = RankFailure(0, 0, 1, 1000, 100, TIMED_OUT, 100.5, 0)
    summary = str(JobFailedError([failure], world_size=2, tracebacks_printed=True, unreachable=notes))
    assert (
        "Rank 0's collective failed because a peer became unreachable, not a hang: rank 1 (pid 7 on node-b, 10.0.0.2) "
        "became unreachable" in summary
    )
    assert "never joined it" not in summary
    without = str(JobFailedError([failure], world_size=2, tracebacks_printed=True))  # no note: as before
    assert "never joined it (a hang, or a collective only some ranks call)" in without


def test_a_lost_rendezvous_is_one_line_naming_the_endpoint() -> None:
    class RendezvousClosedError(Exception):  # torch's name: the text is chosen by the error's type name
        pass

    lost = RendezvousLostError.from_error(RendezvousClosedError(), "10.0.0.1:29400", machine_rank=1)
    assert str(lost).startswith("The job's rendezvous at 10.0.0.1:29400 is gone (RendezvousClosedError): another ")
    assert lost.exit_code == 1


def test_the_lost_store_probe_looks_where_the_settled_record_says(monkeypatch) -> None:
    """A job srun started names rank 0 in the settled record only: the probe looks there, not in os.environ."""
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")  # not the job's (TEST-NET-1): os.environ is not read
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    verdict, text = probe_store({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert verdict == "gone" and f"the job's store at 127.0.0.1:{port} is gone" in text, text


def test_a_loopback_host_name_on_a_multi_machine_job_is_refused_naming_the_fix(monkeypatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")  # resolves to 127.0.0.1 everywhere
    monkeypatch.setenv("ACCEL_MAIN_PROCESS_IP", "127.0.0.1")
    assert not network_check.spans_machines(2, 1)  # every "machine" on this one's loopback: nothing to refuse
    monkeypatch.setenv("ACCEL_MAIN_PROCESS_IP", "10.0.0.1")
    assert network_check.spans_machines(2, 1)
    problem = network_check.loopback_problem("gloo", machine_rank=1)
    assert problem is not None and "its host name 'localhost' resolves to 127.0.0.1, a loopback address" in problem
    assert "Fix: set GLOO_SOCKET_IFNAME to the network interface the machines share" in problem
    with pytest.raises(network_check.NetworkConfigurationError, match=r"rank 1 .* cannot take part: its host name"):
        network_check.check_addresses("gloo", 1, 2, lambda: None, timeout=timedelta(seconds=1))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    assert network_check.loopback_problem("gloo", machine_rank=0) is None  # the interface is named: gloo uses it


def test_the_progress_report_names_silent_and_late_ranks_and_is_silent_when_all_answer_alike() -> None:
    def answer(rank: int, step: int, **more: object) -> dict[str, object]:
        where = {"rank": rank, "answer": 1, "state": "out", "seq": 2, "step": step, "op": "gather", "via": "gather"}
        return {**where, "site": "train.py:5", "since": 9.0, "now": [], "host": "node", "pid": 100 + rank, **more}

    me = answer(0, 5)
    assert compose_progress_report(me, 9.0, {0: me, 1: answer(1, 5)}, 2, 60.0, {}) is None  # a slow step
    report = compose_progress_report(
        me, 9.0, {0: me, 1: answer(1, 4), 2: None}, 3, 60.0, {2: "rank 2 (pid 9 on b, 10.0.0.3): does not answer; x"}
    )
    assert report is not None
    assert report.startswith("accel: stall report from rank 0: it has made no progress for 9 s, in backward #5")
    assert "2 rank(s) hold it up:" in report
    assert "- rank 1 (pid 101 on node): is behind, at backward #4" in report
    assert "- rank 2 (pid 9 on b, 10.0.0.3): does not answer; x" in report
