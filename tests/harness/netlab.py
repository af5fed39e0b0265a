"""Machines on one machine, on a switch: network namespaces joined through a bridge, each with its own address.

``machines(2)`` creates a "switch" namespace holding a bridge and, per machine, a namespace whose veth interface is
plugged into that bridge and carries 10.214.0.<i+1>/24 (addresses that exist only inside the namespaces made here;
each set of machines is its own network, so two sets may reuse them). Everything is deleted at the end. Names carry
the process id and a counter, so several sets can live at once in one test session (and in parallel sessions).

``Machine.command(argv)`` runs ``argv`` inside a machine: its network (``nsenter``: ``ip netns exec`` would mount a
fresh ``/sys`` without the machine's cgroup folders, which ``slurmd`` needs), its own host name (a UTS namespace) and
its own ``/etc/hosts`` (bind-mounted in a mount namespace of the command's own: the machine's file is never touched),
where every machine's name resolves to its address (``hosts_lines`` writes another mapping: a host name that resolves
to 127.0.0.1, as Debian's default line for the machine's own name does). Servers started there listen on the
namespaces' networks only. ``Machine.cut`` and ``Machine.restore`` take a machine's link down and up (a cable or
switch port that fails, then comes back).

Needs root; ``require_namespaces`` skips a test with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

SUBNET = "10.214.0"
_sets = itertools.count()


@dataclass(frozen=True)
class Machine:
    """One namespace "machine": its namespace, interface (on the switch), address and host name, and the
    ``/etc/hosts`` its commands see."""

    namespace: str
    interface: str
    address: str
    hostname: str
    hosts_file: Path

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this machine: its network, host name and ``/etc/hosts``."""
        setup = f"mount --bind {shlex.quote(str(self.hosts_file))} /etc/hosts && hostname {shlex.quote(self.hostname)}"
        inner = f'{setup} && exec "$@"'
        network = f"--net=/run/netns/{self.namespace}"
        return ["nsenter", network, "unshare", "--uts", "--mount", "sh", "-c", inner, "sh", *argv]

    def cut(self) -> None:
        """Takes this machine's link down: its peers' packets get no answer, as when a cable or switch port fails."""
        _ip("-n", self.namespace, "link", "set", "dev", self.interface, "down")

    def restore(self) -> None:
        """Brings the link back up (the address stays)."""
        _ip("-n", self.namespace, "link", "set", "dev", self.interface, "up")

    def kill_all(self) -> None:
        """SIGKILLs every process still in this machine's network (a job's processes that outlived their daemon)."""
        listed = subprocess.run(["ip", "netns", "pids", self.namespace], capture_output=True, text=True, timeout=30)
        for pid in listed.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def require_namespaces() -> None:
    """Skips the calling test where network namespaces cannot be made (not root, a tool missing, not permitted)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    for tool in ("ip", "nsenter", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            pytest.skip(f"network namespaces need the {tool!r} command")
    probe = f"accel-probe-{os.getpid()}-{next(_sets)}"  # several sets may be made at once (threads of one test)
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"ip netns add is not permitted here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)


@contextlib.contextmanager
def machines(
    count: int, hostname_prefix: str = "node", hosts_lines: Callable[[list[Machine]], list[str]] | None = None
) -> Iterator[list[Machine]]:
    """``count`` machines named ``<hostname_prefix>0``... on one bridge; deleted (their processes killed) at the end.

    hosts_lines: the ``/etc/hosts`` lines every machine sees, given the machines; by default each machine's name maps
    to its own address.
    """
    require_namespaces()
    tag = f"m{os.getpid() % 100000}x{next(_sets)}"  # veth names are at most 15 characters: m<pid>x<set>v<i>
    switch = f"{tag}sw"
    folder = Path(tempfile.mkdtemp(prefix="accel-netlab-"))
    made = [switch]
    found: list[Machine] = []
    try:
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for index in range(count):
            namespace = f"{tag}n{index}"
            _ip("netns", "add", namespace)
            made.append(namespace)
            inside, port = f"{tag}v{index}", f"{tag}p{index}"
            _ip("link", "add", inside, "netns", namespace, "type", "veth", "peer", "name", port, "netns", switch)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            address = f"{SUBNET}.{index + 1}"
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            found.append(Machine(namespace, inside, address, f"{hostname_prefix}{index}", folder / "hosts"))
        if hosts_lines is not None:
            lines = hosts_lines(found)
        else:
            lines = ["127.0.0.1 localhost", *(f"{m.address} {m.hostname}" for m in found)]
        (folder / "hosts").write_text("\n".join(lines) + "\n")
        yield found
    finally:
        for machine in found:
            machine.kill_all()
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
