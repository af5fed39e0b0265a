"""A multi-machine job whose ranks would talk over a loopback address: refused before the process group, on every rank.

gloo advertises to its peers the address its machine's host name resolves to (without ``GLOO_SOCKET_IFNAME``), and
many machines' ``/etc/hosts`` map their own name to 127.0.0.1 or 127.0.1.1. On one machine that is right; across
machines every peer then connects to itself: one machine failed after 5 s with ``Gloo connectFullMesh failed ...
remote=[127.0.0.1]``, the other only after minutes, and a job with restarts retried the same failure. Likewise a
rank not on rank 0's machine that is handed a ``MASTER_ADDR`` resolving to loopback would look for the job's store on
itself.

``check_addresses`` runs in each rank before ``init_process_group`` of a job that spans machines: it works out the
address gloo would advertise (as gloo does: the host name's first address that binds, else loopback). A rank that
finds a loopback address writes why into the job's store and raises; the others, waiting at the same point for every
rank to arrive, read it and raise the same error, so every machine stops at once with one message naming the fix.
No torch import here: the store is handed in.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from . import environment as env

_KEYS = "accel/netcheck/"


class NetworkConfigurationError(RuntimeError):
    """The machines of a job cannot reach each other as configured (a loopback address on a multi-machine job)."""


def spans_machines(world_size: int, local_world_size: int, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the job's processes run on more than one machine, reached over a network: not when its rendezvous
    address (``accel launch --main-process-ip``, else ``MASTER_ADDR``) is a loopback one (all on this machine).
    environ: the run's settled variables (``RunSettings.environ``; ``os.environ`` when not given)."""
    environ = os.environ if environ is None else environ
    if (env.get_int(env.GROUP_WORLD_SIZE, 0, environ) or 0) <= 1 and world_size <= local_world_size:
        return False
    endpoint = environ.get(env.MAIN_PROCESS_IP) or environ.get(env.MASTER_ADDR) or ""
    return bool(endpoint) and not _resolves_to_loopback(endpoint)


def _resolves_to_loopback(host: str) -> bool:
    try:
        return _is_loopback(str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]))
    except OSError:
        return False


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False


def gloo_address() -> tuple[str, str]:
    """(the address gloo advertises on this machine without GLOO_SOCKET_IFNAME, the host name it comes from).

    As gloo's default device: the first address of ``gethostname()`` that a socket can bind, else the loopback.
    """
    hostname = socket.gethostname()
    try:
        found = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except OSError:
        return "127.0.0.1", hostname
    for family, kind, protocol, _, address in found:
        try:
            with socket.socket(family, kind, protocol) as probe:
                probe.bind(address)
        except OSError:
            continue
        return str(address[0]), hostname
    return "127.0.0.1", hostname


def _interfaces() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex() if name != "lo"]
    except OSError:
        return []


def loopback_problem(backend: str, machine_rank: int, environ: Mapping[str, str] | None = None) -> str | None:
    """Why this rank would talk to the other machines over a loopback address, or None."""
    environ = os.environ if environ is None else environ
    interfaces = _interfaces()
    example = interfaces[0] if interfaces else "eth0"
    named = f" (this machine's: {', '.join(interfaces)})" if interfaces else ""
    if "gloo" in backend and not environ.get(env.GLOO_SOCKET_IFNAME):
        address, hostname = gloo_address()
        if _is_loopback(address):
            return (
                f"its host name {hostname!r} resolves to {address}, a loopback address (an /etc/hosts line "
                f"'{address} {hostname}', as many systems write), and gloo advertises that address to the other "
                "machines, which cannot reach it there. Fix: set GLOO_SOCKET_IFNAME to the network interface the "
                f"machines share{named} on every machine, e.g. `GLOO_SOCKET_IFNAME={example} accel launch ...` (and "
                f"NCCL_SOCKET_IFNAME for a GPU job), or map {hostname!r} to its network address in /etc/hosts"
            )
    master = environ.get(env.MASTER_ADDR, "")
    if machine_rank > 0 and master and _resolves_to_loopback(master):
        return (
            f"the address of rank 0's machine it was handed, MASTER_ADDR={master!r}, resolves to a loopback address "
            "here: this machine would look for the job's store on itself. Fix: make rank 0's host "
            "name resolve to its network address on every machine (/etc/hosts), or pass torchrun's --local-addr "
            "with that address on rank 0's machine"
        )
    return None


def check_addresses(
    backend: str,
    rank: int,
    world_size: int,
    connect: Callable[[], Any],
    timeout: timedelta,
    environ: Mapping[str, str] | None = None,
) -> Any:
    """Raises ``NetworkConfigurationError`` on every rank when one would use a loopback address across machines.

    connect: makes the client of the job's store that ``init_process_group`` will use (or returns None: no store
    to meet in, then only the rank that finds the problem raises); its store is returned. Every rank meets there
    before the process group: a rank that found a problem writes it and raises, the others read it and raise too.
    """
    hostname = socket.gethostname()
    environ = os.environ if environ is None else environ
    machines = env.get_int(env.GROUP_WORLD_SIZE, 0, environ) or "several"
    problem = loopback_problem(backend, env.get_int(env.GROUP_RANK, 0, environ) or 0, environ)
    text = f"accel: this job spans {machines} machines, but rank {rank} (on {hostname}) cannot take part: {problem}."
    if problem is not None and problem.startswith("the address of rank 0's machine"):
        raise NetworkConfigurationError(text)  # the store is on that address: there is nobody to tell
    store = connect()
    if store is None:
        if problem is not None:
            raise NetworkConfigurationError(text)
        return None
    if problem is not None:
        if store.add(_KEYS + "problems", 1) == 1:
            store.set(_KEYS + "first", text)
        raise NetworkConfigurationError(text)
    store.add(_KEYS + "arrived", 1)
    deadline = time.monotonic() + timeout.total_seconds()
    while time.monotonic() < deadline:
        if store.add(_KEYS + "problems", 0):
            first = store.get(_KEYS + "first").decode()
            raise NetworkConfigurationError(f"{first} (Found by that rank; rank {rank} on {hostname} stops with it.)")
        if store.add(_KEYS + "arrived", 0) >= world_size:
            break
        time.sleep(0.05)
    return store
