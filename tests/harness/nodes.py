"""Several "machines" on one: an ``accel launch`` agent per node, all meeting at a rendezvous on 127.0.0.1.

Each ``NodeAgent`` is one node's ``accel launch --num-machines ... --machine-rank R --main-process-ip
127.0.0.1`` process (torchrun's agent and its workers). A test kills a node by having its worker SIGKILL
the agent (its workers die with it, as a machine that is lost), and starts the node again as a
cluster's scheduler would. ``finish`` waits with a timeout, so a job that hangs fails its test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from processes import kill_tree


def accel_command() -> list[str]:
    """The ``accel`` command of this interpreter's environment."""
    script = Path(sys.executable).parent / "accel"
    return [str(script)] if script.exists() else [sys.executable, "-m", "accel.cli"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class NodeAgent:
    """One node's ``accel launch`` process; its output goes to a temporary file (read by ``output``)."""

    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes] = field(repr=False)

    @classmethod
    def start(
        cls,
        name: str,
        machine_rank: int,
        launch_args: list[str],
        env: dict[str, str],
        rank_flag: str = "--machine-rank",
    ) -> NodeAgent:
        """``accel launch --machine-rank R <launch_args>``; ``launch_args`` ends with the script and its arguments.

        ``rank_flag``: the flag that gives the rank (``--node_rank``: a torchrun launch line)."""
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the agent: it outlives this call)
        command = [*accel_command(), "launch", rank_flag, str(machine_rank), *launch_args]
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return cls(name, process, log)

    def wait(self, timeout: float) -> int:
        """The agent's exit code (negative: killed by that signal); kills it and raises after ``timeout``."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"node {self.name} did not end within {timeout:.0f}s:\n{self.output()}") from None

    def kill(self) -> None:
        """Kills the agent and its workers (processes.kill_tree: torchrun's workers are in sessions of their own)."""
        if self.process.poll() is None:
            kill_tree(self.process.pid)
            self.process.wait()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-8000:]


def finish(agents: list[NodeAgent], timeout: float) -> dict[str, int]:
    """Waits for every agent (each within ``timeout``), killing all of them if one does not end."""
    codes: dict[str, int] = {}
    try:
        for agent in agents:
            codes[agent.name] = agent.wait(timeout)
    finally:
        for agent in agents:
            agent.kill()
    return codes
