"""What became of a rank that stopped answering: stopped, gone, or out of reach. Part of the stall report.

A rank whose watch thread does not answer a stall request through the job's store (``stall_report``) may be
stopped (SIGSTOP, a debugger), blocked in native code holding Python's lock, dead, or cut off by the network.
The store cannot tell these apart; a direct look can:

- each rank's watch serves a small TCP socket (``ProbeListener``) on the address it reaches the store from (the
  interface the job's traffic uses; 127.0.0.1 for a one-machine job), and registers that address, its host name,
  pid and start time in the store when it starts;
- a reporting rank reads a silent peer's registration and ``probe``s it: on the same machine, the kernel's record
  of the process (``/proc/<pid>/stat``: state T is stopped); then a TCP connection to its socket: refused (the
  process is gone, its machine is up), no connection (the machine or the link is down), connected but no answer
  (the process exists and does not run), or an answer (its Python runs: it lost the store, not its peers).

The listener thread blocks in ``accept`` and costs nothing until probed. When the store itself stops answering
(the machine holding it is cut off), ``probe_store`` tells out of reach from gone the same way.

A verdict of "unreachable" is also written where ``accel launch`` reads it (``record_unreachable``): when the job
ends with a collective timeout, its summary says the peer became unreachable instead of blaming a hang.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from . import environment as env

CONNECT_TIMEOUT = 2.0  # seconds a probe waits for a connection, then for the answer
UNREACHABLE_RECORD = "stall-unreachable-"  # + rank + ".json" in the launcher's records folder


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), None off Linux or gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 else None


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def reach_address(environ: Mapping[str, str]) -> str:
    """The local address this process reaches ``MASTER_ADDR`` from (no packet is sent), 127.0.0.1 without one.
    environ: the run's settled variables (``RunSettings.environ``)."""
    master = environ.get(env.MASTER_ADDR) or "127.0.0.1"
    port = int(environ.get(env.MASTER_PORT) or 29500)
    try:
        family = socket.getaddrinfo(master, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as udp:
            udp.connect(family[4])  # a route lookup only: UDP's connect sends nothing
            return udp.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class ProbeListener:
    """One rank's probe socket: answers each connection with ``answer()`` (this rank's position, as JSON)."""

    def __init__(self, answer: Callable[[], dict[str, Any]], environ: Mapping[str, str]) -> None:
        self.answer = answer
        self.address = reach_address(environ)
        self.socket = socket.socket(socket.AF_INET6 if ":" in self.address else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind((self.address, 0))
        self.socket.listen(8)
        self.port: int = self.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="accel-stall-probe", daemon=True)

    def identity(self, rank: int) -> dict[str, Any]:
        """What a peer needs to look at this process: registered in the store once."""
        pid = os.getpid()
        host = socket.gethostname()
        return {"rank": rank, "host": host, "pid": pid, "address": self.address, "port": self.port,
                "started": _start_time(pid)}  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return  # closed
            with contextlib.suppress(OSError), connection:
                connection.settimeout(CONNECT_TIMEOUT)
                connection.sendall(json.dumps(self.answer()).encode())

    def close(self) -> None:
        """Closes the socket; ``shutdown`` first wakes the thread blocked in ``accept`` (Linux), which then ends."""
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.socket.close()


def who(peer: dict[str, Any]) -> str:
    """``rank 1 (pid 4242 on node-b, 10.0.0.2)``."""
    return f"rank {peer['rank']} (pid {peer['pid']} on {peer['host']}, {peer['address']})"


def probe(peer: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None]:
    """(verdict, text, its position if it answered) for a silent peer's registration.

    verdict: ``stopped`` (alive, stopped by a signal), ``frozen`` (alive, its Python does not run), ``gone``,
    ``unreachable`` or ``answers`` (alive and running; it lost the store).
    """
    pid = int(peer["pid"])
    started = peer.get("started")
    if started is not None and _start_time(pid) == started:  # the same process, on this machine
        state = _proc_state(pid)
        if state in ("T", "t"):
            return (
                "stopped",
                (
                    f"its process is alive but stopped (state {state}: SIGSTOP, SIGTSTP or a debugger; "
                    f"`kill -CONT {pid}` lets it go on)"
                ),
                None,
            )
        if state in ("Z", "X"):
            return "gone", "its process has ended (a zombie its launcher has not reaped yet)", None
    try:
        connection = socket.create_connection((peer["address"], int(peer["port"])), timeout=CONNECT_TIMEOUT)
    except ConnectionRefusedError:
        return (
            "gone",
            f"its process is gone: nothing listens at {peer['address']}:{peer['port']} (its machine answers)",
            None,
        )
    except OSError as error:
        return "unreachable", unreachable_text(peer["host"], peer["address"], error), None
    with connection:
        connection.settimeout(CONNECT_TIMEOUT)
        received = b""
        with contextlib.suppress(OSError):
            while chunk := connection.recv(65536):
                received += chunk
    if not received:
        return (
            "frozen",
            (
                f"its process is alive but does not run: it accepted a connection and sent nothing in "
                f"{CONNECT_TIMEOUT:.0f} s (stopped by a signal, or blocked in native code holding Python's lock)"
            ),
            None,
        )
    try:
        position = json.loads(received)
    except ValueError:
        position = None
    return "answers", "its process runs and answers directly, but lost the job's store", position


def unreachable_text(host: str, address: str, error: OSError) -> str:
    """Why a connection to ``host`` failed, worded as what a user checks."""
    if isinstance(error, TimeoutError) or error.errno in (errno.ETIMEDOUT, None):
        why = f"no answer within {CONNECT_TIMEOUT:.0f} s"
    else:
        why = os.strerror(error.errno) if error.errno else str(error)
    where = host if host == address else f"{host} ({address})"
    return f"unreachable: {where} does not answer ({why}): its network link or the machine is down"


def probe_store(environ: Mapping[str, str]) -> tuple[str, str]:
    """(verdict, text) for the job's store at ``MASTER_ADDR:MASTER_PORT`` of ``environ`` (the run's settled record: a
    job srun or mpirun started names rank 0 there, not in ``os.environ``), which stopped answering."""
    address, port = environ.get(env.MASTER_ADDR, "?"), environ.get(env.MASTER_PORT, "0")
    try:
        with socket.create_connection((address, int(port)), timeout=CONNECT_TIMEOUT):
            return "answers", f"the job's store at {address}:{port} accepts connections but does not answer in time"
    except ConnectionRefusedError:
        return "gone", f"the job's store at {address}:{port} is gone (rank 0's machine answers; its agent ended)"
    except OSError as error:
        return "unreachable", f"the job's store at {address}:{port} (rank 0's machine) is " + unreachable_text(
            address, address, error
        )


def record_unreachable(rank: int, text: str, environ: Mapping[str, str]) -> None:
    """Leaves ``text`` where ``accel launch``'s failure summary reads it (its records folder, ``ACCEL_FINISH_RECORDS``
    in ``environ``, the run's settled record), if launched by it."""
    folder = environ.get(env.FINISH_RECORDS)
    if not folder:
        return
    with contextlib.suppress(OSError):
        temporary = os.path.join(folder, f".{UNREACHABLE_RECORD}{rank}.tmp")
        with open(temporary, "w") as handle:
            json.dump({"rank": rank, "text": text, "at": time.time()}, handle)
        os.replace(temporary, os.path.join(folder, f"{UNREACHABLE_RECORD}{rank}.json"))


def read_unreachable(folder: str) -> list[dict[str, Any]]:
    """The ``record_unreachable`` notes in ``folder``, oldest first (for the failure summary)."""
    notes: list[dict[str, Any]] = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(UNREACHABLE_RECORD) and entry.name.endswith(".json"):
                with contextlib.suppress(OSError, ValueError), open(entry.path) as handle:
                    notes.append(json.load(handle))
    return sorted(notes, key=lambda note: note.get("at", 0))
