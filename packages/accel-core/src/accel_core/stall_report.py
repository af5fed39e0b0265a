"""The stall report: when a rank has waited in one of accel's collectives too long, say who is missing and where.

A collective that one rank never reaches (a ``gather`` under ``if accelerator.is_main_process``, a
rank stuck in data loading) makes the others wait for the collective timeout, 30 minutes by default,
and then fail without saying where the missing rank was. This module prints, once per stalled
collective and without stopping anything, which ranks have not reached it and where each of them is:
its last accel collective with the line of the script that called it, and the line it runs now.
``--collective-timeout`` still decides when the job gives up.

How it stays off the step path:

- accel's own collectives (``gather``, ``gather_object``, ``reduce``, ``broadcast``,
  ``broadcast_object_list``, ``pad_across_processes``, ``wait_for_everyone``,
  ``gather_for_metrics``, and ``save_state`` / ``load_state`` / ``save_model``, which every process
  calls) are wrapped by ``watched``, which writes a sequence number, the operation,
  the script's call site (a short walk up the Python frames) and the time into one in-process record
  (``POSITION``): a few microseconds (2.5-5 µs measured on a loaded 2-core machine), against the tens
  of microseconds any collective costs, and nothing at all for a step that calls none of them (a DDP
  step's gradient all-reduce is torch's own).
- One daemon thread per rank (``StallWatch``) reads that record every ``poll`` seconds. It alone talks
  to the rendezvous store, so the training thread never waits on the network for this.
- Ranks tell their position only when asked: a rank whose record shows the same collective running
  past the threshold takes the report (one per collective, elected with an atomic ``store.add``),
  raises the request counter, and every rank's thread answers at its next poll with its record and
  the line its training thread runs now (``sys._current_frames``, read from the thread: no cost to
  the training thread). A rank that does not answer within a few polls is reported as silent
  (killed, or blocked without releasing Python); a rank whose script ended says so at exit.

The store: the agent's (``TORCHELASTIC_USE_AGENT_STORE``, under this attempt's prefix, see
``attempt_store``) or the one rank 0 serves for ``env://``, both at ``MASTER_ADDR:MASTER_PORT``; a
client connection of its own, made by the thread. Without one (a group joined another way) the
stalled rank still reports its own wait, without the others' positions.

The threshold: ``InitProcessGroupKwargs(stall_report_after=...)`` where a script sets its timeout,
else ``ACCEL_STALL_REPORT_AFTER`` (``accel launch --stall-report-after``), else 60 s; 0 turns it off.
"""

from __future__ import annotations

import atexit
import json
import linecache
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from threading import get_ident
from time import monotonic
from types import CodeType, FrameType
from typing import Any, ParamSpec, TypeVar

from . import environment as env
from .attempt_store import attempt_prefix

# Checkpoint calls every process makes, whose report says so (a save under `if accelerator.is_main_process:`).
EVERY_PROCESS_SAVES = ("save_state", "load_state", "save_model")

DEFAULT_STALL_REPORT_AFTER = 60.0
"""Seconds one collective may run before its rank reports the stall (``0`` turns the report off)."""

P = ParamSpec("P")
R = TypeVar("R")


class Position:
    """This process's place among accel's collectives: written by ``watched``, read by the watch thread.

    Plain attributes, written by one thread and read by another without a lock: the reader may see
    a record being updated, which at worst makes one report name the previous call site.
    """

    __slots__ = ("code", "depth", "entered", "left", "offset", "op", "seq", "thread", "via")

    def __init__(self) -> None:
        self.depth = 0  # >0 while inside a watched collective (nested calls count once)
        self.seq = 0  # watched collectives entered so far
        self.op = ""
        self.via = ""  # the accel function the script called (save_state, gather, ...)
        self.code: CodeType | None = None  # the code of the script's frame that called it
        self.offset = 0  # the frame's last instruction then (its f_lasti)
        self.entered = 0.0  # time.monotonic() at entry
        self.left = 0.0  # ... at the last exit
        self.thread = 0  # the thread that entered it

    def site(self) -> str:
        """``file:line`` of the script's call of the last collective."""
        if self.code is None:
            return "?"
        line = next((n for start, end, n in self.code.co_lines() if start <= self.offset < end), None)
        return f"{_short(self.code.co_filename)}:{line if line is not None else '?'}"


POSITION = Position()


_ACCEL_CODE: dict[CodeType, bool] = {}  # code object -> whether it is accel's (or contextlib's): asked once each


def _is_accel(code: CodeType, frame: FrameType) -> bool:
    known = _ACCEL_CODE.get(code)
    if known is None:
        name = frame.f_globals.get("__name__", "")
        known = _ACCEL_CODE[code] = name.startswith(("accel_", "accel.", "contextlib")) or name == "accel"
    return known


def watched(op: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Records entry into and exit from the collective ``op`` in ``POSITION`` (outermost call only).

    The script's call site is the first frame up the stack outside accel's packages (and contextlib's,
    for ``main_process_first``), kept as its code object and instruction offset: the line number is
    worked out only when a report needs it, and no frame (with its locals) is kept alive.
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @wraps(function)
        def recorded(*args: P.args, **kwargs: P.kwargs) -> R:
            position = POSITION
            if position.depth:
                return function(*args, **kwargs)
            frame = sys._getframe(1)
            code = frame.f_code
            via = op
            while _is_accel(code, frame) and frame.f_back is not None:
                via = code.co_name
                frame = frame.f_back
                code = frame.f_code
            position.seq += 1
            position.op, position.via, position.code, position.offset = op, via, code, frame.f_lasti
            position.thread = get_ident()
            position.entered = monotonic()
            position.depth = 1
            try:
                return function(*args, **kwargs)
            finally:
                position.depth = 0
                position.left = monotonic()

        return recorded

    return decorate


def stall_report_after(given: float | timedelta | None = None) -> float:
    """Seconds before a stalled collective is reported: the script's keyword, ``ACCEL_STALL_REPORT_AFTER``, 60."""
    if given is not None:
        seconds = given.total_seconds() if isinstance(given, timedelta) else float(given)
        source = "stall_report_after"
    else:
        raw = (os.environ.get(env.STALL_REPORT_AFTER) or "").strip()
        source = f"Environment variable {env.STALL_REPORT_AFTER}={raw!r}"
        try:
            seconds = float(raw) if raw else DEFAULT_STALL_REPORT_AFTER
        except ValueError:
            seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{source}: the stall report's threshold must be 0 (off) or a positive number of seconds.")
    return seconds


def _short(path: str) -> str:
    """A path relative to the working directory when under it (shorter lines in the report)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def _where(frame: FrameType | None, depth: int = 3) -> list[str]:
    """The innermost ``depth`` frames of a thread, innermost last: ``file:line in function: source``."""
    lines: list[str] = []
    while frame is not None and len(lines) < depth:
        code = frame.f_code
        if code.co_filename.startswith("<frozen"):  # runpy's frames under the script's module level
            break
        source = linecache.getline(code.co_filename, frame.f_lineno).strip()
        lines.append(
            f"{_short(code.co_filename)}:{frame.f_lineno} in {code.co_name}" + (f": {source}" if source else "")
        )
        frame = frame.f_back
    return lines[::-1]


def describe_position(position: Position, now: float, answer: int, rank: int) -> dict[str, Any]:
    """What a rank tells the others: its record and the line its training thread runs now."""
    inside = position.depth > 0
    thread = position.thread or threading.main_thread().ident
    frame = sys._current_frames().get(thread) if thread is not None else None
    return {
        "rank": rank,
        "answer": answer,
        "state": "in" if inside else "out",
        "seq": position.seq,
        "op": position.op,
        "via": position.via,
        "site": position.site(),
        "since": round(now - (position.entered if inside else position.left), 1) if position.seq else None,
        "now": _where(frame),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _collective(p: dict[str, Any]) -> str:
    via = f", called through {p['via']}" if p.get("via") and p["via"] != p["op"] else ""
    return f"{p['op']} #{p['seq']} at {p['site']}{via}"


def compose_report(
    reporter: dict[str, Any],
    positions: dict[int, dict[str, Any] | None],
    world_size: int,
    timeout: float | None,
    asked: bool = True,
) -> str:
    """The report's text, from the stalled rank's position and every rank's answer (None: no answer).

    asked: False when there was no store to ask the others through (their positions are unknown).
    """
    head = (
        f"accel: stall report from rank {reporter['rank']}: it has waited {reporter['since']:.0f} s in "
        f"{_collective(reporter)}."
    )
    same: list[int] = []
    lines: list[str] = []
    for rank in range(world_size):
        p = positions.get(rank)
        if p is not None and p["state"] == "in" and p["seq"] == reporter["seq"] and p["op"] == reporter["op"]:
            same.append(rank)
            continue
        if p is None and not asked:
            lines.append(f"  - rank {rank}: position unknown (no rendezvous store at MASTER_ADDR:MASTER_PORT to ask)")
            continue
        if p is None:
            lines.append(
                f"  - rank {rank}: did not answer (its process was killed, or it is blocked without releasing Python)"
            )
            continue
        who = f"  - rank {rank} (pid {p['pid']} on {p['host']})"
        if p["state"] == "exited":
            last = f"; its last collective was {_collective(p)}" if p["seq"] else ""
            lines.append(f"{who}: its script has ended{last}")
            continue
        if p["state"] == "in":
            where = f"waits in {_collective(p)} for {p['since']:.0f} s"
        elif p["seq"]:
            where = f"is not in a collective; its last was {_collective(p)}, {p['since']:.0f} s ago"
        else:
            where = "has not called a collective yet"
        now = "".join(f"\n      {line}" for line in p["now"])
        lines.append(f"{who}: {where}; now at:{now}" if now else f"{who}: {where}")
    missing = world_size - len(same)
    body = [head]
    if lines:
        body.append(f"{missing} rank(s) have not reached it:")
        body.extend(lines)
    else:
        body.append("Every rank is in it: the collective itself is slow (a large transfer, a slow network).")
    body.append(f"In it: rank(s) {_ranges(same)}.")
    if reporter["op"] in EVERY_PROCESS_SAVES and lines:
        body.append(
            f"{reporter['op']} is called on every process: each writes or reads its part and they agree on the "
            "outcome (as in Accelerate); under `if accelerator.is_main_process:` the others never reach it."
        )
    limit = f"{timeout:.0f} s" if timeout is not None else "the collective timeout"
    body.append(
        f"The job goes on; this collective fails when it has waited {limit} (accel launch --collective-timeout). "
        "A collective every rank must call sits under a condition on the rank, or a rank is stuck before it."
    )
    return "\n".join(body)


def _ranges(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    spans: list[str] = []
    start = previous = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ", ".join(spans)


_KEYS = "accel/stall/"
_REQUEST = "request"


class StallWatch:
    """The daemon thread of one rank: answers the others' requests and reports its own stalls.

    threshold: seconds one collective may run before this rank reports it.
    timeout: the collective timeout in seconds (named in the report), None if unknown.
    """

    def __init__(self, rank: int, world_size: int, threshold: float, timeout: float | None) -> None:
        self.rank, self.world_size, self.threshold, self.timeout = rank, world_size, threshold, timeout
        # Polls often enough to report within a quarter of the threshold, at most every 5 s (one
        # store round trip per poll), at least every 0.5 s.
        self.poll = min(max(threshold / 4, 0.5), 5.0)
        self.store: Any = None
        self.answered = 0
        self.reported_seq = 0
        self._lock = threading.Lock()  # one user of the store client at a time (the thread, then atexit)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accel-stall-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        atexit.register(self._at_exit)

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        next_connect = 0.0
        while not self._stop.wait(self.poll):
            now = time.monotonic()
            if self.store is None and now >= next_connect:
                self.store = _connect()
                next_connect = now + 60.0
                if self._stop.is_set():  # the script ended while connecting: the exit handler tells the others
                    break
            try:
                with self._lock:
                    self._tick(now)
            # torch's store errors are RuntimeErrors. The store gone (rank 0 ended, the agent restarting):
            # report locally from now on (a new connection is tried once a minute).
            except (RuntimeError, OSError, ValueError):
                self.store = None

    def _tick(self, now: float) -> None:
        if self.store is not None:
            wanted = self.store.add(_KEYS + _REQUEST, 0)
            if wanted > self.answered:
                self._answer(wanted, now)
        position = POSITION
        if not position.depth or position.seq == self.reported_seq or now - position.entered < self.threshold:
            return
        self.reported_seq = position.seq
        mine = describe_position(position, now, 0, self.rank)
        if self.store is None:
            report = compose_report(mine, {self.rank: mine}, self.world_size, self.timeout, asked=False)
            print(report, file=sys.stderr, flush=True)
            return
        positions: dict[int, dict[str, Any] | None]
        try:
            if self.store.add(f"{_KEYS}reporter/{position.op}#{position.seq}", 1) != 1:
                return  # another rank waiting in the same collective reports it
            request = self.store.add(_KEYS + _REQUEST, 1)
            self._answer(request, now)
            positions = self._collect(request)
        except (RuntimeError, OSError, ValueError):  # the store went away: this rank's own wait, at least
            self.store, positions = None, {self.rank: mine}
        asked = self.store is not None
        print(compose_report(mine, positions, self.world_size, self.timeout, asked), file=sys.stderr, flush=True)

    def _answer(self, request: int, now: float) -> None:
        self.store.set(f"{_KEYS}rank/{self.rank}", json.dumps(describe_position(POSITION, now, request, self.rank)))
        self.store.add(f"{_KEYS}answers/{request}", 1)
        self.answered = request

    def _collect(self, request: int) -> dict[int, dict[str, Any] | None]:
        """Every rank's answer to ``request``: waits up to three polls of the others (plus 2 s)."""
        deadline = time.monotonic() + 3 * self.poll + 2.0
        while time.monotonic() < deadline and not self._stop.is_set():  # an exiting script does not wait for it
            done = self.store.add(f"{_KEYS}answers/{request}", 0) + self.store.add(_KEYS + "exited", 0)
            if done >= self.world_size:
                break
            time.sleep(0.2)
        positions: dict[int, dict[str, Any] | None] = {}
        for rank in range(self.world_size):
            key = f"{_KEYS}rank/{rank}"
            found = json.loads(self.store.get(key)) if self.store.check([key]) else None
            fresh = found is not None and (found["state"] == "exited" or found["answer"] >= request)
            positions[rank] = found if fresh else None
        return positions

    # -- at exit -----------------------------------------------------------------------------
    def _at_exit(self) -> None:
        """Stops the thread, then tells the others this rank's script has ended (a stalled rank reports it as
        ended, not silent)."""
        self._stop.set()
        # Wait for the thread to leave the store call it may be in. A daemon thread still inside torch's C++ (the
        # GIL released) when the interpreter finalizes is ended by Python with pthread_exit as it takes the GIL
        # back; that unwinds through pybind11's noexcept GIL guard and the process aborts ("terminate called
        # without an active exception") after the script succeeded. A store that answers does so in milliseconds.
        self._thread.join(timeout=_EXIT_WAIT)
        if self.store is None or not self._lock.acquire(timeout=2.0):
            return
        try:
            told = describe_position(POSITION, time.monotonic(), 0, self.rank)
            told.update(state="exited", now=[])
            self.store.set(f"{_KEYS}rank/{self.rank}", json.dumps(told))
            self.store.add(_KEYS + "exited", 1)
        except (RuntimeError, OSError):
            pass  # the store is gone already: nobody is left to read it
        finally:
            self._lock.release()


# The store client's timeout (connecting to a store not yet up is retried that long), and the longest an exiting
# script waits for the watch thread to leave a store call.
_STORE_TIMEOUT = timedelta(seconds=10)
_EXIT_WAIT = 5.0


def _connect() -> Any:
    """A client of the job's store (see the module docstring), or None where there is none to reach."""
    address, port = os.environ.get(env.MASTER_ADDR), os.environ.get(env.MASTER_PORT)
    if not address or not port:
        return None
    try:
        import torch.distributed as dist

        store = dist.TCPStore(address, int(port), is_master=False, timeout=_STORE_TIMEOUT)
        prefix = attempt_prefix()
        return dist.PrefixStore(prefix, store) if prefix is not None else store
    except (RuntimeError, OSError, ValueError):  # DistNetworkError is a RuntimeError
        return None


_WATCH: list[StallWatch] = []


def watch_threshold() -> float | None:
    """The running watch's threshold in seconds (None without one: one process, or the report turned off)."""
    return _WATCH[0].threshold if _WATCH else None


def start_watch(rank: int, world_size: int, given: float | timedelta | None, timeout: float | None) -> None:
    """Starts this process's watch thread once (nothing for one process or a threshold of 0)."""
    threshold = stall_report_after(given)
    if _WATCH or world_size < 2 or threshold == 0:
        return
    watch = StallWatch(rank, world_size, threshold, timeout)
    _WATCH.append(watch)
    watch.start()
