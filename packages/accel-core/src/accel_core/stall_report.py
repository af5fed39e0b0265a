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
  the training thread). A rank that does not answer within a few polls is looked at directly
  (``stall_probe``: stopped, alive but not running Python, gone, or its machine unreachable); a rank
  whose script ended says so at exit.
- A rank stalled anywhere else (DDP's gradient all-reduce inside ``backward``, a collective called
  through torch) is seen through its progress mark: ``accelerator.backward`` adds one to
  ``POSITION.step`` (one attribute increment, ~30 ns). A second daemon thread (the guard, which never
  calls the store) notices when the mark and the collective count have not moved for the threshold;
  the store thread then asks every rank and reports those behind it or silent (``stall_text``), and
  nothing when all answer at its step (a slow step). When the store is lost, or one store call hangs
  (a TCPStore client waits forever on a connection whose link went down), the guard reports that
  the store's machine is out of reach, and leaves a note for ``accel launch``'s failure summary.

The store: see ``stall_store``; a client connection of its own, made by the thread. Without one (a
group joined another way) the stalled rank still reports its own wait, without the others' positions.

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
from collections.abc import Callable, Mapping
from datetime import timedelta
from functools import wraps
from threading import get_ident
from time import monotonic
from types import CodeType, FrameType
from typing import Any, ParamSpec, TypeVar

from . import environment as env
from .stall_probe import ProbeListener, probe, probe_store, record_unreachable, who
from .stall_store import TimedStore, connect_store
from .stall_text import compose_lost_store_report, compose_progress_report, compose_report

DEFAULT_STALL_REPORT_AFTER = 60.0
"""Seconds one collective may run before its rank reports the stall (``0`` turns the report off)."""

P = ParamSpec("P")
R = TypeVar("R")


class Position:
    """This process's place among accel's collectives: written by ``watched``, read by the watch thread.

    Plain attributes, written by one thread and read by another without a lock: the reader may see
    a record being updated, which at worst makes one report name the previous call site.
    """

    __slots__ = ("code", "depth", "entered", "left", "offset", "op", "seq", "step", "thread", "via")

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
        # accelerator.backward calls so far: the training loop's progress, bumped at the cost of one attribute
        # increment. The watch thread compares it with the other ranks' when this rank stops moving.
        self.step = 0

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


def stall_report_after(given: float | timedelta | None, environ: Mapping[str, str]) -> float:
    """Seconds before a stalled collective is reported: the script's keyword, ``ACCEL_STALL_REPORT_AFTER`` in
    ``environ`` (the run's settled record, ``RunSettings.environ``), 60."""
    if given is not None:
        seconds = given.total_seconds() if isinstance(given, timedelta) else float(given)
        source = "stall_report_after"
    else:
        raw = (environ.get(env.STALL_REPORT_AFTER) or "").strip()
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


def _line(frame: FrameType) -> str:
    code = frame.f_code
    source = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return f"{_short(code.co_filename)}:{frame.f_lineno} in {code.co_name}" + (f": {source}" if source else "")


def _is_library(frame: FrameType) -> bool:
    """torch's, accel's or the standard library's frame: not where the script stands."""
    name = frame.f_globals.get("__name__", "")
    return name.split(".")[0] in _LIBRARIES or name.startswith("accel_")


_LIBRARIES = frozenset(("torch", "accel", "contextlib", "runpy", "threading"))  # and every accel_* package


def _where(frame: FrameType | None, depth: int = 3) -> list[str]:
    """The innermost ``depth`` frames of a thread, innermost last: ``file:line in function: source``.

    When all of them are torch's or accel's (a rank waiting in DDP's all-reduce inside ``backward``), the script's
    innermost line comes first, then ``...``: where the script is matters more than torch's internals.
    """
    lines: list[str] = []
    script: str | None = None
    shown_script = False
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen"):  # runpy's frames under the script's module level
            break
        library = _is_library(frame)
        if len(lines) < depth:
            lines.append(_line(frame))
            shown_script = shown_script or not library
        elif shown_script:
            break
        elif not library:
            script = _line(frame)
            break
        frame = frame.f_back
    return ([script, "..."] if script else []) + lines[::-1]


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
        "step": position.step,
        "op": position.op,
        "via": position.via,
        "site": position.site(),
        "since": round(now - (position.entered if inside else position.left), 1) if position.seq else None,
        "now": _where(frame),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


_KEYS = "accel/stall/"
_REQUEST = "request"


class StallWatch:
    """The daemon thread of one rank: answers the others' requests and reports its own stalls.

    threshold: seconds one collective may run (or this rank may make no progress) before this rank reports it.
    timeout: the collective timeout in seconds (named in the report), None if unknown.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        threshold: float,
        timeout: float | None,
        environ: Mapping[str, str],
    ) -> None:
        self.rank, self.world_size, self.threshold, self.timeout = rank, world_size, threshold, timeout
        # The run's settled variables (RunSettings.environ): where the job's store is (MASTER_ADDR / MASTER_PORT),
        # where `accel launch` reads the notes of unreachable peers (ACCEL_FINISH_RECORDS).
        self.environ = environ
        # Polls often enough to report within a quarter of the threshold, at most every 5 s (one
        # store round trip per poll), at least every 0.5 s.
        self.poll = min(max(threshold / 4, 0.5), 5.0)
        # A store call that takes longer means the store is out of reach (its machine's link is down).
        self.store_timeout = timedelta(seconds=min(max(2 * self.poll, 2.0), 10.0))
        self.store: Any = None  # a TimedStore client, None without one
        self.store_lost = False  # a store was reached once, or is named by MASTER_ADDR, and does not answer now
        self.ever_connected = False
        # One store call longer than this means the store is out of reach: a TCPStore client waits forever on a
        # connection whose link went down, so the guard thread, which never calls the store, reports then.
        self.store_limit = self.store_timeout.total_seconds() + 1.0
        self.registered = False
        self.answered = 0
        self.reported_seq = 0
        # Progress: the (step, collective) mark this rank was last seen at, since when, and the last one reported.
        self.mark: tuple[int, int] = (-1, -1)
        self.mark_since = time.monotonic()
        self.reported_mark: tuple[int, int] | None = None  # by the store thread, asking the others
        self.wanted_mark: tuple[int, int] | None = None  # set by the guard for the store thread to report
        self.lost_store_mark: tuple[int, int] | None = None  # reported by the guard: the store out of reach
        self.listener: ProbeListener | None = None
        self._lock = threading.Lock()  # one user of the store client at a time (the thread, then atexit)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="accel-stall-watch", daemon=True)
        self._guard = threading.Thread(target=self._guard_run, name="accel-stall-guard", daemon=True)

    def start(self) -> None:
        try:
            self.listener = ProbeListener(
                lambda: describe_position(POSITION, time.monotonic(), 0, self.rank), self.environ
            )
            self.listener.start()
        except OSError:  # no address to listen on: silent peers are reported without a direct look
            self.listener = None
        self._thread.start()
        self._guard.start()
        atexit.register(self._at_exit)

    # -- the thread --------------------------------------------------------------------------
    def _run(self) -> None:
        next_connect = 0.0
        while not self._stop.wait(self.poll):
            now = time.monotonic()
            # Not again once lost (its machine is gone or out of reach): each failed connection prints torch's C++
            # stack; a store not up yet at the start is tried once a minute.
            if self.store is None and now >= next_connect and not (self.store_lost and self.ever_connected):
                client, named = connect_store(self.store_timeout, self.environ)
                self.store = TimedStore(client) if client is not None else None
                self.ever_connected = self.ever_connected or self.store is not None
                self.store_lost = self.store_lost or (named and self.store is None)
                next_connect = now + 60.0
                if self._stop.is_set():  # the script ended while connecting: the exit handler tells the others
                    break
            try:
                with self._lock:
                    self._tick(now)
            # torch's store errors are RuntimeErrors. The store gone (rank 0 ended, the agent restarting, its
            # machine out of reach): report locally from now on (a new connection is tried once a minute).
            except (RuntimeError, OSError, ValueError):
                self.store, self.store_lost, self.registered = None, True, False

    def _tick(self, now: float) -> None:
        if self.store is not None:
            self.store_lost = False
            if not self.registered and self.listener is not None:
                self.store.set(f"{_KEYS}peer/{self.rank}", json.dumps(self.listener.identity(self.rank)))
                self.registered = True
            self._answer_pending(now)
        wanted = self.wanted_mark
        if wanted is not None and wanted != self.reported_mark and wanted == self.mark:
            self.reported_mark = wanted
            self._report_no_progress(now)
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
            positions = self._ask(now)
            fates = self._fates(positions)
        except (RuntimeError, OSError, ValueError):  # the store went away: this rank's own wait, at least
            self.store, fates = None, {}
            positions = {self.rank: mine}
        asked = self.store is not None
        report = compose_report(mine, positions, self.world_size, self.timeout, asked, fates)
        print(report, file=sys.stderr, flush=True)

    def _report_no_progress(self, now: float) -> None:
        """This rank has been at one (step, collective) mark for the threshold, outside accel's collectives (in
        DDP's all-reduce inside backward, say): reports the ranks behind it and those that do not answer."""
        mine = describe_position(POSITION, now, 0, self.rank)
        since = now - self.mark_since
        if self.store is None:
            return  # the guard reports a lost store
        if self.store.add(f"{_KEYS}reporter/progress#{self.mark[0]}.{self.mark[1]}", 1) != 1:
            return  # another rank at the same mark reports it
        positions = self._ask(now)
        fates = self._fates(positions)
        report = compose_progress_report(mine, since, positions, self.world_size, self.timeout, fates)
        if report is not None:
            print(report, file=sys.stderr, flush=True)

    # -- the guard thread: progress, and a store that stopped answering --------------------------
    def _guard_run(self) -> None:
        """Watches this rank's progress without touching the store: hands a stall to the store thread to report,
        or reports itself when the store is lost or one store call has hung (its machine out of reach)."""
        while not self._stop.wait(self.poll):
            now = time.monotonic()
            position = POSITION
            mark = (position.step, position.seq)
            if mark != self.mark or position.depth:
                self.mark, self.mark_since = mark, now  # progress, or inside a collective (the store thread's)
                continue
            if now - self.mark_since < self.threshold:
                continue
            store = self.store
            hung = store is not None and store.busy_for(now) > self.store_limit
            if store is not None and not hung:
                self.wanted_mark = mark  # the store thread asks the others at its next poll
            elif (hung or self.store_lost) and mark != self.lost_store_mark:
                self.lost_store_mark = mark
                self._report_lost_store(now)

    def _report_lost_store(self, now: float) -> None:
        mine = describe_position(POSITION, now, 0, self.rank)
        verdict, fate = probe_store(self.environ)
        report = compose_lost_store_report(mine, now - self.mark_since, fate, self.world_size)
        print(report, file=sys.stderr, flush=True)
        if verdict == "unreachable":
            record_unreachable(self.rank, fate, self.environ)

    def _answer_pending(self, now: float) -> None:
        wanted = self.store.add(_KEYS + _REQUEST, 0)
        if wanted > self.answered:
            self._answer(wanted, now)

    def _answer(self, request: int, now: float) -> None:
        self.store.set(f"{_KEYS}rank/{self.rank}", json.dumps(describe_position(POSITION, now, request, self.rank)))
        self.store.add(f"{_KEYS}answers/{request}", 1)
        self.answered = request

    def _ask(self, now: float) -> dict[int, dict[str, Any] | None]:
        """Asks every rank for its position and collects the answers (None: none came)."""
        request = self.store.add(_KEYS + _REQUEST, 1)
        self._answer(request, now)
        return self._collect(request)

    def _collect(self, request: int) -> dict[int, dict[str, Any] | None]:
        """Every rank's answer to ``request``: waits up to two polls of the others (plus 1 s). A rank that answers
        later is looked at directly (``_fates``), which finds it running."""
        deadline = time.monotonic() + 2 * self.poll + 1.0
        while time.monotonic() < deadline and not self._stop.is_set():  # an exiting script does not wait for it
            done = self.store.add(f"{_KEYS}answers/{request}", 0) + self.store.add(_KEYS + "exited", 0)
            if done >= self.world_size:
                break
            self._answer_pending(time.monotonic())  # another rank asking at the same time gets its answer
            time.sleep(0.2)
        positions: dict[int, dict[str, Any] | None] = {}
        for rank in range(self.world_size):
            key = f"{_KEYS}rank/{rank}"
            found = json.loads(self.store.get(key)) if self.store.check([key]) else None
            fresh = found is not None and (found["state"] == "exited" or found["answer"] >= request)
            positions[rank] = found if fresh else None
        return positions

    def _fates(self, positions: dict[int, dict[str, Any] | None]) -> dict[int, str]:
        """For each rank that did not answer: who it is and what a direct look finds (stopped, gone, unreachable).

        A rank whose look finds it running (it answered late, or lost the store) gets its answer in ``positions``.
        """
        fates: dict[int, str] = {}
        for rank, position in positions.items():
            key = f"{_KEYS}peer/{rank}"
            if position is not None or not self.store.check([key]):
                continue
            peer = json.loads(self.store.get(key))
            verdict, fate, answer = probe(peer)
            if answer is not None:
                positions[rank] = answer
                continue
            fates[rank] = f"{who(peer)}: does not answer; {fate}"
            if verdict == "unreachable":
                record_unreachable(self.rank, f"{who(peer)} became {fate}", self.environ)
        return fates

    def stop(self) -> None:
        """Stops the thread and closes the probe socket (the thread leaves any store call first)."""
        self._stop.set()
        # Wait for the thread to leave the store call it may be in. A daemon thread still inside torch's C++ (the
        # GIL released) when the interpreter finalizes is ended by Python with pthread_exit as it takes the GIL
        # back; that unwinds through pybind11's noexcept GIL guard and the process aborts ("terminate called
        # without an active exception") after the script succeeded. A store that answers does so in milliseconds.
        self._thread.join(timeout=_EXIT_WAIT)
        self._guard.join(timeout=_EXIT_WAIT)
        if self.listener is not None:
            self.listener.close()

    # -- at exit -----------------------------------------------------------------------------
    def _at_exit(self) -> None:
        """Stops the thread, then tells the others this rank's script has ended (a stalled rank reports it as
        ended, not silent)."""
        self.stop()
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


# The longest an exiting script waits for the watch thread to leave a store call.
_EXIT_WAIT = 5.0


_WATCH: list[StallWatch] = []


def watch_threshold() -> float | None:
    """The running watch's threshold in seconds (None without one: one process, or the report turned off)."""
    return _WATCH[0].threshold if _WATCH else None


def start_watch(
    rank: int,
    world_size: int,
    given: float | timedelta | None,
    timeout: float | None,
    environ: Mapping[str, str],
) -> None:
    """Starts this process's watch thread once (nothing for one process or a threshold of 0).

    environ: the run's settled variables (``RunSettings.environ``, the process state's), which name the job's store
    and the threshold's variable."""
    threshold = stall_report_after(given, environ)
    if _WATCH or world_size < 2 or threshold == 0:
        return
    watch = StallWatch(rank, world_size, threshold, timeout, environ)
    _WATCH.append(watch)
    watch.start()
