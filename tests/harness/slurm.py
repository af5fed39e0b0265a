"""A real SLURM cluster for the tests: ``slurmctld`` and one ``slurmd`` per "machine", each machine a network namespace.

``slurm_cluster(folder)`` writes a ``slurm.conf`` (``AuthType=auth/none``, no munge, no cgroups, no accounting: a
temporary state and spool folder under ``folder``), starts the controller and two node daemons in two machines of
``netlab.machines`` (``slurm-node0`` at 10.214.0.1 runs the controller and node 0, ``slurm-node1`` node 1), waits
until both nodes are idle (about 2 s) and stops everything at the end: jobs cancelled, every process left in the
namespaces killed, namespaces deleted. SLURM's daemons and ``srun`` listen on every address of their network: inside
namespaces made for the test, nothing listens on the machine's own network.

Client commands (``srun``, ``sbatch``, ``scontrol``, ``squeue``) run in host 0 through ``SlurmCluster.command``, with
``SLURM_CONF`` naming the test's configuration. ``KillWait`` (the grace between a job's SIGTERM and its SIGKILL) is
30 s, as SLURM's default.

Needs root (network namespaces, ``slurmd``); ``require_slurm`` skips a test with the reason where the SLURM binaries
are missing (``tests/clusters/setup.sh`` installs them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from netlab import Machine, machines, require_namespaces

BINARIES = ("slurmctld", "slurmd", "srun", "sbatch", "scontrol", "squeue", "sinfo", "scancel")
KILL_WAIT = 30  # seconds between a job's SIGTERM (requeue, cancel, preemption) and its SIGKILL


def require_slurm() -> None:
    """Skips the calling test where SLURM or network namespaces are not available here."""
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing): run tests/clusters/setup.sh as root")
    require_namespaces()


def _config(folder: Path, hosts: list[Machine]) -> str:
    nodes = "\n".join(f"NodeName={h.hostname} NodeAddr={h.address} CPUs=4 State=UNKNOWN" for h in hosts)
    return f"""\
ClusterName=accel-test
SlurmctldHost={hosts[0].hostname}({hosts[0].address})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait={KILL_WAIT}
JobRequeue=1
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """A running two-node cluster: its hosts, its folder (configuration, logs, state) and its daemons."""

    hosts: list[Machine]
    folder: Path
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (this process's environment by default) with ``SLURM_CONF`` naming the cluster's configuration."""
        return {**(dict(os.environ) if base is None else base), "SLURM_CONF": str(self.conf)}

    def command(self, argv: Sequence[str], host: int = 0) -> list[str]:
        """``argv`` (a SLURM client command, or anything else) run on host ``host``."""
        return self.hosts[host].command(argv)

    def query(self, *argv: str) -> str:
        """A client command's output (``scontrol``, ``squeue``, ``sinfo``); raises with its error when it fails."""
        done = subprocess.run(self.command(argv), env=self.env(), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def job_field(self, job_id: str, name: str) -> str:
        """One field of ``scontrol show job`` (``JobState``, ``Restarts``, ``ExitCode``...)."""
        text = self.query("scontrol", "show", "job", "-o", job_id)
        for item in text.split():
            key, _, value = item.partition("=")
            if key == name:
                return value
        raise KeyError(f"scontrol show job {job_id} has no {name}: {text}")

    def log(self, name: str) -> str:
        """A daemon's log (``slurmctld``, ``slurmd-accel-host0``...), for a failing test's message."""
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                states = self.query("sinfo", "-N", "-h", "-o", "%N %T")
                if states.split().count("idle") == len(self.hosts):
                    return
            for daemon in self.daemons:
                if daemon.poll() is not None:
                    break
            time.sleep(0.2)
        raise RuntimeError(
            f"SLURM nodes not idle within {timeout:.0f}s: {states.strip()!r}\nslurmctld:\n{self.log('slurmctld')}\n"
            + "\n".join(f"slurmd {h.hostname}:\n{self.log('slurmd-' + h.hostname)}" for h in self.hosts)
        )

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancels every job and waits until none is left (SIGKILL after ``KILL_WAIT``)."""
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.query("scancel", "--user=root")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                if not self.query("squeue", "-h", "-o", "%i").strip():
                    return
            time.sleep(0.3)

    def stop(self) -> None:
        """Ends the daemons and every process still in the hosts' namespaces (job steps outlive ``slurmd``)."""
        for daemon in self.daemons:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in self.daemons:
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        for host in self.hosts:
            host.kill_all()


@contextlib.contextmanager
def slurm_cluster(folder: Path, start_timeout: float = 60) -> Iterator[SlurmCluster]:
    """A two-node SLURM cluster in two network namespaces, its files under ``folder``; stopped at the end."""
    require_slurm()
    with machines(2, hostname_prefix="slurm-node") as hosts:
        cluster = SlurmCluster(hosts, folder)
        (folder / "state").mkdir(parents=True, exist_ok=True)
        for host in hosts:
            (folder / f"spool-{host.hostname}").mkdir(exist_ok=True)
        cluster.conf.write_text(_config(folder, hosts))
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": cluster.env()}
        try:
            cluster.daemons.append(
                subprocess.Popen(cluster.command(["slurmctld", "-D", "-i", "-f", str(cluster.conf)]), **quiet)
            )
            for index, host in enumerate(hosts):
                argv = ["slurmd", "-D", "-f", str(cluster.conf), "-N", host.hostname]
                cluster.daemons.append(subprocess.Popen(cluster.command(argv, host=index), **quiet))
            cluster._wait_idle(start_timeout)
            yield cluster
        finally:
            cluster.cancel_all()
            cluster.stop()
