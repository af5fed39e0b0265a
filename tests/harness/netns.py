"""Machines on one machine: network namespaces joined by a veth pair, each with its own address and host name.

``linked_hosts(2)`` creates two namespaces (``ip netns add``) whose veth ends carry 10.213.x.1 and 10.213.x.2 (an
address block of the namespaces' own, never the machine's), and deletes them at the end. ``Host.command(argv)`` runs
``argv`` inside one: its own network, its own host name (a UTS namespace) and its own ``/etc/hosts`` (a file
bind-mounted in a mount namespace of the command's own; the machine's ``/etc/hosts`` is never touched). By default
each host name resolves to its veth address, as on a well-configured cluster; ``hosts_file`` overrides the mapping
(a host whose name resolves to 127.0.0.1). ``cut`` and ``restore`` take a host's link down and up.

Needs root (``ip netns``); ``require_netns`` skips a test with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

_ADDRESS_BLOCK = "10.213"  # + .<pair>.<host>: private addresses that exist only inside the namespaces made here


@dataclass
class Host:
    """One namespace "machine": its namespace, veth interface, address and host name."""

    namespace: str
    interface: str
    address: str
    hostname: str
    hosts_file: Path

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host: its network, host name and ``/etc/hosts``."""
        setup = f"mount --bind {shlex.quote(str(self.hosts_file))} /etc/hosts && hostname {shlex.quote(self.hostname)}"
        inner = f'{setup} && exec "$@"'
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "--mount", "sh", "-c", inner, "sh", *argv]

    def cut(self) -> None:
        """Takes this host's link down (its peer sees no answer, as when a cable or switch fails)."""
        _ip("-n", self.namespace, "link", "set", "dev", self.interface, "down")

    def restore(self) -> None:
        """Brings the link back up (the address stays)."""
        _ip("-n", self.namespace, "link", "set", "dev", self.interface, "up")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def require_netns() -> None:
    """Skips the calling test where network namespaces cannot be created (not root, no ``ip``, no unshare)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    for tool in ("ip", "unshare", "mount", "hostname"):
        if shutil.which(tool) is None:
            pytest.skip(f"network namespaces need the {tool!r} command")
    probe = f"accel-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"ip netns add is not permitted here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)


@contextlib.contextmanager
def linked_hosts(count: int = 2, hosts_lines: Callable[[list[Host]], list[str]] | None = None) -> Iterator[list[Host]]:
    """Two namespace hosts joined by one veth pair, deleted at the end.

    hosts_lines: the ``/etc/hosts`` lines every host sees, given the hosts; by default each host's name maps to
    its own address.
    """
    if count != 2:
        raise ValueError("linked_hosts makes two hosts (one veth pair)")
    require_netns()
    tag = f"{os.getpid() % 100000}"
    pair = os.getpid() % 250 + 1
    names = [f"acc{tag}h{i}" for i in range(count)]
    folder = Path(tempfile.mkdtemp(prefix="accel-netns-"))
    hosts: list[Host] = []
    try:
        for name in names:
            _ip("netns", "add", name)
        _ip("link", "add", f"{names[0]}v", "type", "veth", "peer", "name", f"{names[1]}v")
        for index, name in enumerate(names):
            address = f"{_ADDRESS_BLOCK}.{pair}.{index + 1}"
            interface = f"{name}v"
            _ip("link", "set", interface, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", interface)
            _ip("-n", name, "link", "set", "dev", interface, "up")
            _ip("-n", name, "link", "set", "dev", "lo", "up")
            hosts.append(Host(name, interface, address, f"accel-host{index}", folder / "hosts"))
        lines = (
            hosts_lines(hosts)
            if hosts_lines
            else ["127.0.0.1 localhost", *(f"{h.address} {h.hostname}" for h in hosts)]
        )
        (folder / "hosts").write_text("\n".join(lines) + "\n")
        yield hosts
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)  # takes its veth end along
        shutil.rmtree(folder, ignore_errors=True)
