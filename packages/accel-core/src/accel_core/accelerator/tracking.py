"""The Accelerator's experiment tracking, routed to accel-tracking's trackers on the main process.

Core only knows the protocols (``accel_core.protocols``); the trackers are found through entry points
when first used, and a missing one is an ImportError naming it. A resumed run's trackers continue the
checkpoint's run (``Tracking.continue_from``, called by ``resumption``).

``init_trackers`` runs no collective, so it may be called on every process or under
``if accelerator.is_main_process:`` (diffusers' scripts), as in Accelerate. The main process publishes
the outcome of each call in the job's rendezvous store without waiting for anyone; a process other
than the main one that calls it too reads the outcome of the main process's matching call from there
and raises its error. Only the other processes wait (for the main process), never the main process.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import discovery
from ..protocols import ContinuableTracker, RewindableTracker
from ..stall_report import watch_threshold
from ..state.process_state import group_timeout

if TYPE_CHECKING:
    from ..configuration import ProjectConfiguration
    from .nonfinite_guard import NonFiniteGuard
    from .process_control import ProcessControl


class _InactiveTracker:
    """What ``get_tracker`` returns on processes that do not log: a tracker's methods do nothing here, and any other
    name (a typo) raises AttributeError as it would on the main process."""

    is_active = False
    main_process_only = True
    requires_logging_directory = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.tracker = None  # the backend's raw object, as an inactive tracker's
        self.run_id: str | None = None

    def start(self) -> None:
        """Does nothing: only the main process logs."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Does nothing: only the main process logs."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Does nothing: only the main process logs."""

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Does nothing: only the main process logs."""

    def log_table(self, table_name: str, *args: Any, **kwargs: Any) -> None:
        """Does nothing: only the main process logs."""

    def finish(self) -> None:
        """Does nothing: only the main process logs."""


def normalize_log_with(log_with: Any) -> list[Any]:
    """Turns ``log_with`` into a list of tracker names / instances, checking names are installed."""
    if log_with is None:
        return []
    items = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    result: list[Any] = []
    for item in items:
        if isinstance(item, str):  # also LoggerType, a str enum
            name = str(item).lower()
            if name != "all" and not discovery.is_available("accel.trackers", name):
                raise discovery.MissingPackageError(
                    f"Tracker '{name}' is not available: {discovery.install_hint('accel.trackers', name)}. "
                    f"Installed trackers: {', '.join(discovery.available('accel.trackers')) or 'none'}."
                )
            result.append(name)
        elif hasattr(item, "log") and hasattr(item, "name"):
            result.append(item)
        else:
            raise TypeError(f"log_with items must be tracker names or tracker objects, got {type(item).__name__}.")
    return result


class Tracking:
    """Experiment tracking on the main process: ``init_trackers``, ``log``, ``get_tracker``.

    process: the Accelerator's process view (only the main process logs). project_configuration: where
    file-writing trackers write (``logging_dir``). log_with: the normalized ``log_with``. nonfinite_guard:
    its skip count is logged with ``log`` (None without ``skip_nonfinite``).

    It also keeps what a checkpoint stores of the logging (``progress`` / ``restore``): the last step
    logged and the runs of the W&B / MLflow trackers, so a resumed run continues them.
    """

    def __init__(
        self,
        process: ProcessControl,
        project_configuration: ProjectConfiguration,
        log_with: list[Any],
        nonfinite_guard: NonFiniteGuard | None,
    ) -> None:
        self._process = process
        self._project_configuration = project_configuration
        self._nonfinite_guard = nonfinite_guard
        self.log_with = log_with
        self.trackers: list[Any] = []
        self.last_logged_step: int | None = None  # saved with checkpoints: where a resumed run's trackers rewind to
        self.runs_to_continue: dict[str, str] = {}  # tracker name -> run id, from the loaded checkpoint
        self._pending_rewind: tuple[int | None] | None = None  # (last step,) once resumed, until trackers start
        # Names the store keys of this Accelerator's init_trackers calls: every process makes its Accelerators in the
        # same order, so the n-th call of one Accelerator on a process matches the main process's n-th call.
        self._number = next(_TRACKING_NUMBERS)
        self._init_calls = 0

    @property
    def logging_dir(self) -> str | None:
        """``ProjectConfiguration.logging_dir``: where file-writing trackers write."""
        return self._project_configuration.logging_dir

    def init_trackers(self, project_name: str, config: dict[str, Any] | None, init_kwargs: dict[str, Any]) -> None:
        """Starts the trackers of ``log_with`` on the main process; its failure also raises on the other processes
        that call ``init_trackers``. No collective: calling it on the main process only is fine."""
        state = self._process._current_state
        self._init_calls += 1
        key = f"{_OUTCOME_KEYS}{self._number}/{self._init_calls}"
        store = _default_store() if state.use_distributed else None
        if not state.is_main_process:
            # The main process started the trackers (or failed to): raise its error here too, instead of leaving
            # this process to wait at its next collective for a main process that has stopped.
            if store is not None:
                outcome = _await_outcome(store, key, self._init_calls)
                if outcome:
                    raise RuntimeError(f"init_trackers failed on the main process: {outcome}")
            return
        try:
            self._start_trackers(project_name, config, init_kwargs)
        except BaseException as error:
            if store is not None:
                _publish_outcome(store, key, f"{type(error).__name__}: {error}")
            raise
        if store is not None:
            _publish_outcome(store, key, "")

    def _start_trackers(self, project_name: str, config: dict[str, Any] | None, init_kwargs: dict[str, Any]) -> None:
        wanted = self.log_with or ["local"]
        names: list[Any] = []
        for item in wanted:
            if item == "all":
                names += [n for n in discovery.available("accel.trackers") if _tracker_class(n).is_available()]
            else:
                names.append(item)
        self.trackers = []
        for item in names:
            if isinstance(item, str):
                if any(getattr(t, "name", None) == item for t in self.trackers):
                    continue
                tracker = _tracker_class(item)(project_name, self.logging_dir, **init_kwargs.get(item, {}))
            else:
                tracker = item
            if config is not None:
                tracker.store_init_configuration(config)
            self.trackers.append(tracker)
        self._apply_rewind()  # a resumed run continues the checkpoint's run

    def get_tracker(self, name: str, unwrap: bool) -> Any:
        """The tracker called ``name`` (its raw library object with ``unwrap=True``); a do-nothing one off the main
        process."""
        if not self._process._current_state.is_main_process:
            return _InactiveTracker(name)
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"No tracker named {name!r} was started: call init_trackers first, with log_with={name!r}.")

    def log(self, values: dict[str, Any], step: int | None, log_kwargs: dict[str, Any]) -> None:
        """Logs ``values`` to every started tracker (main process only), with the skip count of ``skip_nonfinite``."""
        if self._nonfinite_guard is not None:
            values = {**values, **self._nonfinite_guard.unlogged()}
        if step is not None:
            last = self.last_logged_step
            self.last_logged_step = int(step) if last is None else max(last, int(step))
        if not self._process._current_state.is_main_process:
            return
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def finish(self) -> None:
        """Closes the started trackers."""
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []

    # -- what a checkpoint keeps of the logging -----------------------------------------------
    def progress(self) -> dict[str, Any]:
        """The last logged step and, where trackers log to a service's runs, those runs (main process)."""
        progress: dict[str, Any] = {"last_logged_step": self.last_logged_step}
        runs = {t.name: t.run_id for t in self.trackers if isinstance(t, ContinuableTracker) and t.run_id}
        if runs:  # the W&B / MLflow runs a resumed job continues (main process: the one with trackers)
            progress["tracker_runs"] = runs
        return progress

    def restore(self, progress: dict[str, Any]) -> None:
        """Takes back what ``progress`` returned when the checkpoint was saved."""
        if "last_logged_step" in progress:
            self.last_logged_step = progress["last_logged_step"]
        self.runs_to_continue = dict(progress.get("tracker_runs", {}))

    def continue_from(self, last_step: int | None) -> None:
        """A run resumed at ``last_step`` (None: from nothing): trackers continue the checkpoint's run and forget
        what was logged after it, now or when they start."""
        self._pending_rewind = (last_step,)
        if self.trackers:
            self._apply_rewind()

    def _apply_rewind(self) -> None:
        if self._pending_rewind is None:
            return
        (last_step,) = self._pending_rewind
        self._pending_rewind = None
        for tracker in self.trackers:
            if isinstance(tracker, ContinuableTracker) and tracker.name in self.runs_to_continue:
                tracker.continue_run(self.runs_to_continue[tracker.name], last_step)
            elif isinstance(tracker, RewindableTracker):
                tracker.rewind(last_step)


def _tracker_class(name: str) -> Any:
    return discovery.load("accel.trackers", name)


# -- the outcome of the main process's init_trackers, through the rendezvous store ------------------------------------
_OUTCOME_KEYS = "accel/init_trackers/"
_TRACKING_NUMBERS = itertools.count(1)


def _default_store() -> Any:
    """The default process group's store (torch's rendezvous store), or None where there is none to use."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        if not dist.is_available() or not dist.is_initialized():
            return None
        return distributed_c10d._get_default_store()  # the group's own store: torch has no public accessor
    except (ImportError, AttributeError, RuntimeError, ValueError):
        return None


def _publish_outcome(store: Any, key: str, outcome: str) -> None:
    """The main process: "" (started) or the error, for the other processes; never waits for them."""
    with contextlib.suppress(RuntimeError, OSError):  # the store gone: the job is ending, nobody is left to read it
        store.set(key, outcome)


def _await_outcome(store: Any, key: str, call: int) -> str:
    """Another process: waits for the main process's outcome of the same init_trackers call (its ``call``-th).

    It says so once it has waited as long as the stall report's threshold, and gives up after the collective
    timeout, as a collective would.
    """
    started = time.monotonic()
    limit = group_timeout().total_seconds()
    threshold = watch_threshold()
    told = False
    pause = 0.01
    where = (
        f"init_trackers call #{call} waits for the main process's init_trackers call #{call}, which tells "
        "every process that calls it whether the trackers started"
    )
    advice = (
        "The main process has not finished that call: a tracker is slow to start, or the main process does not "
        "call init_trackers where this process does. Call it on every process, or under "
        "`if accelerator.is_main_process:` only."
    )
    while not store.check([key]):
        waited = time.monotonic() - started
        if waited >= limit:
            raise RuntimeError(f"accel: {where}; it gave up after {limit:.0f} s (the collective timeout). {advice}")
        if threshold and not told and waited >= threshold:
            told = True
            rank = _rank()
            print(f"accel: rank {rank}: {where}; it has waited {waited:.0f} s. {advice}", file=sys.stderr, flush=True)
        time.sleep(pause)
        pause = min(pause * 2, 0.25)
    return store.get(key).decode("utf-8")


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()
