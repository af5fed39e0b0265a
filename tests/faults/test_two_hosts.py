"""Two machines on a real link: network namespaces with their own addresses, host names and /etc/hosts.

Each host runs ``accel launch --num-machines 2 --machine-rank R --main-process-ip <host 0's address>`` inside its
namespace (tests/harness/netlab.py), as two machines on one network would; the tests break the network as users'
clusters do: host names that resolve to 127.0.0.1, a link that goes down.

Each job runs on its own pair of machines, two at a time (``two_host_jobs``): the two host-name jobs together, then
the two link-cut jobs together. Most of a job's time is waiting (a connect that fails, a rendezvous round, a collective
timeout), which the other job's work fills. (The link-cut jobs do not start with the host-name ones: the delay of the
stall reports after a cut is measured, and a dozen processes importing torch on 2 cores would stretch it.)
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import pytest
from netlab import Machine, machines
from nodes import accel_command, free_port
from processes import kill_tree

STALL_SCRIPT = Path(__file__).resolve().parent / "stall_in_backward.py"


class HostJob:
    """One host's ``accel launch`` of a 2-machine job; its output goes to a file."""

    def __init__(self, host: Machine, rank: int, launch: list[str], folder: Path, env: dict[str, str]) -> None:
        self.host, self.log = host, folder / f"host{rank}.log"
        self.rank, self.launch, self.env = rank, launch, env
        command = host.command([*accel_command(), "launch", "--machine-rank", str(rank), *launch])
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            ended = f"{self.host.hostname} did not end within {timeout:.0f} s:\n{self.output()[-6000:]}"
            raise AssertionError(ended) from None

    def started_again(self, folder: Path) -> HostJob:
        """The same launch on the same host, as a scheduler starts a lost machine's command again."""
        folder.mkdir(exist_ok=True)
        return HostJob(self.host, self.rank, self.launch, folder, self.env)

    def kill(self) -> None:
        if self.process.poll() is None:
            kill_tree(self.process.pid)
            self.process.wait()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "GLOO_", "NCCL_"))}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _launch_both(
    hosts: list[Machine], folder: Path, flags: list[str], script: list[str], env: dict[str, str]
) -> list[HostJob]:
    port = free_port()  # free on the machine; the namespaces have their own ports, so free there too
    launch = ["--cpu", "-n", "2", "--num-machines", "2", "--main-process-ip", hosts[0].address]
    launch += ["--main-process-port", str(port), *flags, *script]
    return [HostJob(host, rank, launch, folder, env) for rank, host in enumerate(hosts)]


def _loopback_for(*names: int) -> Callable[[list[Machine]], list[str]]:
    """An /etc/hosts mapping the host names of hosts ``names`` to 127.0.0.1 (others to their address)."""

    def lines(hosts: list[Machine]) -> list[str]:
        mapped = [f"{'127.0.0.1' if i in names else h.address} {h.hostname}" for i, h in enumerate(hosts)]
        return ["127.0.0.1 localhost", *mapped]

    return lines


@dataclass
class Ended:
    """A two-host job that ended: its machines, each host's exit code and output, and what the scenario timed."""

    hosts: list[Machine]
    folder: Path
    codes: list[int]
    outputs: list[str]
    seconds: dict[str, float]

    @property
    def both(self) -> str:
        return "\n=== host 1\n".join(self.outputs)


def _ended(hosts: list[Machine], folder: Path, jobs: list[HostJob], timeout: float, **seconds: float) -> Ended:
    try:
        codes = [job.wait(timeout) for job in jobs]
    finally:
        for job in jobs:
            job.kill()
    return Ended(hosts, folder, codes, [job.output() for job in jobs], seconds)


def one_host_name_on_loopback(folder: Path) -> Ended:
    # Host 1's name resolves to 127.0.0.1 (host 0's to its address): host 1's ranks would advertise 127.0.0.1 to
    # gloo's peers.
    with machines(2, "accel-host", _loopback_for(1)) as hosts:
        start = time.monotonic()
        jobs = _launch_both(hosts, folder, [], [str(STALL_SCRIPT), str(folder), "100"], _env())
        ended = _ended(hosts, folder, jobs, 240)
        ended.seconds["elapsed"] = time.monotonic() - start
        return ended


def both_host_names_on_loopback_with_restarts(folder: Path) -> Ended:
    # Both names resolve to 127.0.0.1 (Debian's default /etc/hosts line for the machine's own name) and the job may
    # restart.
    with machines(2, "accel-host", _loopback_for(0, 1)) as hosts:
        flags = ["--max-restarts", "1"]
        jobs = _launch_both(hosts, folder, flags, [str(STALL_SCRIPT), str(folder), "100"], _env())
        return _ended(hosts, folder, jobs, 300)


RESTARTABLE = Path(__file__).resolve().parent / "restartable_train.py"
THRESHOLD = 3.0


def _wait_for_step(project: Path, step: int, jobs: list[HostJob], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    progress = project / "progress_rank0"
    while not (progress.exists() and progress.read_text().strip() and int(progress.read_text()) >= step):
        for job in jobs:
            assert job.process.poll() is None, f"{job.host.hostname} ended early:\n{job.output()[-6000:]}"
        assert time.monotonic() < deadline, "\n=== host 1\n".join(job.output()[-4000:] for job in jobs)
        time.sleep(0.1)


def _pid_of(output: str) -> str:
    """The pid of the worker whose summary is in ``output`` (``The job failed: rank 1 (local rank 0, pid N)``)."""
    return output.split("The job failed: rank ")[1].split("pid ")[1].split(")")[0]


def _reported(job: HostJob, text: str, start: float, timeout: float) -> float:
    """Seconds from ``start`` (time.monotonic) until ``text`` appears in the host's output."""
    while text not in job.output():
        assert time.monotonic() - start < timeout, f"no {text!r} within {timeout:.0f} s:\n{job.output()[-6000:]}"
        time.sleep(0.2)
    return time.monotonic() - start


def link_cut_for_good(folder: Path) -> Ended:
    project = folder / "project"
    project.mkdir()
    with machines(2, "accel-host") as hosts:
        flags = ["--stall-report-after", str(THRESHOLD), "--collective-timeout", "25"]
        env = _env(STEP_DELAY="0.3", FAULT_PLAN="{}", ACCEL_CHECKPOINT_FSYNC="0")
        jobs = _launch_both(hosts, folder, flags, [str(RESTARTABLE), str(project)], env)
        try:
            _wait_for_step(project, 4, jobs, 300)
            hosts[1].cut()
            cut = time.monotonic()
            seen0 = _reported(jobs[0], "does not answer; unreachable: accel-host1", cut, 60)
            seen1 = _reported(jobs[1], "It cannot ask the other 1 rank(s): the job's store at ", cut, 60)
        except BaseException:
            for job in jobs:
                job.kill()
            raise
        return _ended(hosts, folder, jobs, 120, seen0=seen0, seen1=seen1)


def link_restored(folder: Path) -> Ended:
    # Host 1's link goes down after the first checkpoint: host 0's stall report names it unreachable, the collective
    # timeout ends both workers, host 0's agent restarts its worker and waits in the next rendezvous round. The link
    # comes back and host 1 is started again (as a scheduler restarts a machine that was lost).
    project = folder / "project"
    project.mkdir()
    with machines(2, "accel-host") as hosts:
        flags = ["--stall-report-after", str(THRESHOLD), "--collective-timeout", "15", "--max-restarts", "2"]
        flags += ["--auto-resume", "--rdzv-conf", "keep_alive_interval=1,keep_alive_max_attempt=5"]
        env = _env(STEP_DELAY="0.3", FAULT_PLAN="{}", ACCEL_CHECKPOINT_FSYNC="0")
        jobs = _launch_both(hosts, folder, flags, [str(RESTARTABLE), str(project)], env)
        try:
            _wait_for_step(project, 4, jobs, 300)
            hosts[1].cut()
            _reported(jobs[0], "does not answer; unreachable: accel-host1", time.monotonic(), 60)
            _reported(jobs[0], "failed (exitcode: 1)", time.monotonic(), 90)  # the collective timeout: a restart
            hosts[1].restore()
            jobs[1].kill()  # the lost machine comes back: its launch starts again
            jobs[1] = jobs[1].started_again(folder / "again")
        except BaseException:
            for job in jobs:
                job.kill()
            raise
        return _ended(hosts, folder, jobs, 400)


@pytest.fixture(scope="module")
def two_host_jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The jobs of this module's selected tests, started in threads: test name -> Future of its ``Ended``.

    The host-name jobs start at once; the link-cut jobs start together when those have ended. A job's own failure (a
    timeout, a host that ended early, a skip where namespaces cannot be made) is raised in its test by
    ``Future.result``."""
    wanted = {item.name for item in request.session.items if getattr(item, "module", None) is request.module}
    names = [name for name in SCENARIOS if name in wanted]
    folders = {name: tmp_path_factory.mktemp(SCENARIOS[name].__name__) for name in names}
    with ThreadPoolExecutor(max_workers=max(len(names), 1), thread_name_prefix="two-hosts") as pool:
        first = {name: pool.submit(SCENARIOS[name], folders[name]) for name in names if name not in LINK_CUTS}

        def after_the_first(name: str) -> Ended:
            wait(first.values())
            return SCENARIOS[name](folders[name])

        yield {**first, **{name: pool.submit(after_the_first, name) for name in names if name in LINK_CUTS}}


def _result(two_host_jobs: dict[str, Future[Ended]], request: pytest.FixtureRequest) -> Ended:
    return two_host_jobs[request.node.name].result(timeout=900)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_host_name_resolving_to_loopback_stops_every_machine_before_training_naming_the_fix(
    two_host_jobs: dict[str, Future[Ended]], request: pytest.FixtureRequest
) -> None:
    # Before: host 1 failed after 5 s with "Gloo connectFullMesh failed ... remote=[127.0.0.1]" and host 0 only after
    # ~155 s. Now every rank of both hosts stops before the process group with one message.
    ended = _result(two_host_jobs, request)
    outputs, both = ended.outputs, ended.both
    assert ended.codes == [1, 1], both
    found = (
        "accel: this job spans 2 machines, but rank 1 (on accel-host1) cannot take part: its host name "
        "'accel-host1' resolves to 127.0.0.1, a loopback address"
    )
    fix = (
        "Fix: set GLOO_SOCKET_IFNAME to the network interface the machines share (this machine's: "
        f"{ended.hosts[1].interface})"
    )
    for output in outputs:
        assert found in output and fix in output, both
        assert "connectFullMesh" not in output and "timed out connecting" not in output, both
    assert "(Found by that rank; rank 0 on accel-host0 stops with it.)" in outputs[0], both
    assert "accel launch: The job failed" in outputs[0] and "accel launch: The job failed" in outputs[1], both
    elapsed = ended.seconds["elapsed"]
    assert elapsed < 200, f"{elapsed:.0f} s"  # before: ~155 s of connect timeout after start-up on host 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_with_restarts_loopback_host_names_end_both_machines_without_a_rendezvous_traceback(
    two_host_jobs: dict[str, Future[Ended]], request: pytest.FixtureRequest
) -> None:
    # Before, the second host printed a raw RendezvousClosedError traceback.
    ended = _result(two_host_jobs, request)
    outputs, both = ended.outputs, ended.both
    assert ended.codes == [1, 1], both
    for rank, output in enumerate(outputs):
        assert f"its host name 'accel-host{rank}' resolves to 127.0.0.1, a loopback address" in output, both
        assert f"GLOO_SOCKET_IFNAME={ended.hosts[rank].interface} accel launch" in output, both
        assert "connectFullMesh" not in output, both
        # A machine whose agent lost the rendezvous says so in one line, not torch's traceback.
        last = output.strip().splitlines()[-1]
        assert "Traceback" not in output.split("accel launch:")[-1], both
        assert last.startswith(("The other ranks were stopped.", "accel launch: The job's rendezvous")) or (
            "The job's rendezvous at" in output
        ), both


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_link_cut_for_good_is_named_as_an_unreachable_host_not_a_hang(
    two_host_jobs: dict[str, Future[Ended]], request: pytest.FixtureRequest
) -> None:
    # Before: no report, then at the collective timeout both hosts ended with "a rank never joined it (a hang, or a
    # collective only some ranks call)". Now each side's stall report names the machine it lost within the threshold
    # (plus the time to ask and look), and the summary says the peer became unreachable.
    ended = _result(two_host_jobs, request)
    hosts, outputs = ended.hosts, ended.outputs
    both = "\n=== host 1\n".join(output[-8000:] for output in outputs)
    print(both)
    assert ended.codes == [1, 1], both
    assert f"- rank 1 (pid {_pid_of(outputs[1])} on accel-host1, {hosts[1].address}): does not answer" in outputs[0]
    assert f"unreachable: accel-host1 ({hosts[1].address}) does not answer" in outputs[0], both
    assert f"(rank 0's machine) is unreachable: {hosts[0].address} does not answer" in outputs[1], both
    # Seconds from the cut to each report: the threshold, a poll, then asking (host 0) or the store call that
    # hangs (host 1), then a 2 s connection attempt; slack for a loaded machine.
    seen0, seen1 = ended.seconds["seen0"], ended.seconds["seen1"]
    print(f"reports {seen0:.1f} s (host 0) and {seen1:.1f} s (host 1) after the cut (threshold {THRESHOLD} s)")
    assert max(seen0, seen1) < THRESHOLD + 15, (seen0, seen1)
    for output in outputs:
        assert "became unreachable, not a hang" in output, both
        assert "never joined it" not in output, both


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_host_whose_link_comes_back_rejoins_and_the_job_resumes_bit_identically(
    two_host_jobs: dict[str, Future[Ended]], request: pytest.FixtureRequest, restartable_reference: Path
) -> None:
    # Both workers resume from the newest complete checkpoint and end with the weights and metrics of an
    # uninterrupted run.
    import json

    import torch
    from safetensors.torch import load_file

    from accel_tracking.local import read_metrics

    ended = _result(two_host_jobs, request)
    both = "\n=== host 1\n".join(output[-6000:] for output in ended.outputs)
    assert ended.codes == [0, 0], both
    project = ended.folder / "project"
    attempts = [json.loads(line) for line in (project / "attempts.jsonl").read_text().splitlines()]
    resumed = [a for a in attempts if a["resumed_from"] is not None]
    assert sorted(a["rank"] for a in resumed) == [0, 1], (attempts, both)
    reference, got = load_file(restartable_reference / "final.safetensors"), load_file(project / "final.safetensors")
    assert reference.keys() == got.keys()
    for name in reference:
        assert torch.equal(reference[name], got[name]), f"{name} differs"
    metrics, reference_metrics = read_metrics(project / "run"), read_metrics(restartable_reference / "run")
    assert [r["step"] for r in metrics] == list(range(1, 17)), metrics
    assert [r["loss"] for r in metrics] == [r["loss"] for r in reference_metrics]


SCENARIOS: dict[str, Callable[[Path], Ended]] = {
    test_a_host_name_resolving_to_loopback_stops_every_machine_before_training_naming_the_fix.__name__: (
        one_host_name_on_loopback
    ),
    test_with_restarts_loopback_host_names_end_both_machines_without_a_rendezvous_traceback.__name__: (
        both_host_names_on_loopback_with_restarts
    ),
    test_a_link_cut_for_good_is_named_as_an_unreachable_host_not_a_hang.__name__: link_cut_for_good,
    test_a_host_whose_link_comes_back_rejoins_and_the_job_resumes_bit_identically.__name__: link_restored,
}
LINK_CUTS = {
    test_a_link_cut_for_good_is_named_as_an_unreachable_host_not_a_hang.__name__,
    test_a_host_whose_link_comes_back_rejoins_and_the_job_resumes_bit_identically.__name__,
}
