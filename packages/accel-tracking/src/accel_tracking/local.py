"""The local tracker: JSON lines on disk, no dependency and no server; accel's default tracker.

Layout of one run::

    <logging_dir>/<run_name>/config.json     # the run's configuration (init_trackers(config=...))
    <logging_dir>/<run_name>/metrics.jsonl   # one {"step": ..., "time": ..., <metrics>} object a line
    <logging_dir>/<run_name>/tables/<name>.json

A line's ``step`` and ``time`` are the tracker's own: the ``step=`` of ``log`` and the wall-clock time.
A metric the script named ``step`` or ``time`` (transformers' ``*_no_trainer`` scripts log
``{"step": completed_steps}``) is stored as ``metric:step`` / ``metric:time`` (a name that already
starts with ``metric:`` followed by one of those gets one more ``metric:``), so nothing a script logs
is refused and nothing overwrites the tracker's fields. ``logged_metrics(record)`` gives a record's
metrics back under the names they were logged with.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import IO, Any

from .base import GeneralTracker, make_logging_dir, resolve_logging_dir, to_python_scalar

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
RESERVED = ("step", "time")
"""The tracker's own fields of each line; a metric of one of these names is stored with ``METRIC_PREFIX``."""
METRIC_PREFIX = "metric:"


def _names_a_reserved_field(name: str) -> bool:
    """Whether ``name`` is ``step`` or ``time`` behind any number of ``metric:`` prefixes."""
    while name.startswith(METRIC_PREFIX):
        name = name[len(METRIC_PREFIX) :]
    return name in RESERVED


def stored_name(key: str) -> str:
    """The name a metric is stored under: ``metric:`` + ``key`` for ``step``, ``time`` (and ``metric:step``, ...,
    so the mapping stays one to one), else ``key`` itself."""
    return METRIC_PREFIX + key if _names_a_reserved_field(key) else key


def logged_name(stored: str) -> str:
    """The name a metric was logged with, from the name it is stored under (``stored_name``'s inverse)."""
    if stored.startswith(METRIC_PREFIX) and _names_a_reserved_field(stored):
        return stored[len(METRIC_PREFIX) :]
    return stored


def _jsonable(value: Any) -> Any:
    """A JSON-friendly form of a logged value (tensors and numpy numbers become numbers, the rest text)."""
    value = to_python_scalar(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # JSON has no NaN/inf; keep them readable and round-trippable as strings (json allows them
        # with allow_nan, but other readers do not).
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):  # small tensors / arrays
        return _jsonable(tolist())
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


class LocalTracker(GeneralTracker):
    """Writes metrics as JSON lines and the config as JSON under ``<logging_dir>/<run_name>/``.

    It needs nothing installed and no server, so it is what ``init_trackers`` uses when
    ``log_with`` was not given. Read a run back with ``read_metrics`` or draw it with
    ``plot_metrics``. Without a logging_dir it writes under ``./runs``.

    Example::

        tracker = LocalTracker("my_run", "logs")
        tracker.store_init_configuration({"lr": 1e-3})
        tracker.log({"loss": 0.5}, step=1)
        tracker.finish()
        read_metrics("logs/my_run")  # [{"step": 1, "time": ..., "loss": 0.5}]
    """

    name = "local"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, flush_every: int = 1) -> None:
        if not run_name:
            raise ValueError("LocalTracker needs a run name: init_trackers('my_project').")
        self.run_name = str(run_name)
        self.run_dir = resolve_logging_dir(logging_dir, self.name) / self.run_name
        make_logging_dir(self.run_dir, self.name)
        # Flushing each line costs little at logging rates and means a crashed run keeps its curve.
        self.flush_every = max(1, int(flush_every))
        self._pending = 0
        # Open for the run's life, closed by finish().
        self._file: IO[str] | None = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115

    @property
    def tracker(self) -> IO[str] | None:
        """The open metrics file (None once finished or on an inactive rank)."""
        return getattr(self, "_file", None)

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_FILE

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # Written whole and renamed into place so a reader never sees half a config.
        target = self.run_dir / CONFIG_FILE
        partial = target.with_suffix(".json.tmp")
        partial.write_text(json.dumps(_jsonable(dict(values)), indent=2, sort_keys=True), encoding="utf-8")
        partial.replace(target)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self._file is None:
            raise ValueError(f"The local tracker of run '{self.run_name}' is finished; start a new run to log more.")
        if not isinstance(values, dict):
            raise TypeError(f"log() takes a dict of metrics, got {type(values).__name__}.")
        record: dict[str, Any] = {"step": None if step is None else int(step), "time": time.time()}
        for key, value in values.items():
            # A metric called "step" or "time" is kept apart from the line's own fields (see the module docstring).
            record[stored_name(str(key))] = _jsonable(value)
        self._file.write(json.dumps(record) + "\n")
        self._pending += 1
        if self._pending >= self.flush_every:
            self._file.flush()
            self._pending = 0

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        if dataframe is not None:
            columns, data = [str(c) for c in dataframe.columns], dataframe.values.tolist()
        if columns is None or data is None:
            raise ValueError("log_table needs `columns` and `data`, or a pandas `dataframe`.")
        tables = self.run_dir / "tables"
        tables.mkdir(exist_ok=True)
        suffix = "" if step is None else f"_step{int(step)}"
        (tables / f"{table_name}{suffix}.json").write_text(
            json.dumps({"columns": list(columns), "data": _jsonable(list(data)), "step": step}), encoding="utf-8"
        )

    def rewind(self, last_step: int | None) -> None:
        """Continues the run from a checkpoint: drops the records logged with a step after ``last_step``.

        Called by ``Accelerator.resume_if_possible`` (``resume="auto"``): the steps between that
        checkpoint and the crash are trained (and logged) again, and must not be there twice.
        ``None`` drops every record that has a step (a restarted run with no checkpoint starts over).
        """
        if self._file is not None:
            self._file.close()
        path = self.metrics_path
        kept = [
            record
            for record in (read_metrics(path) if path.is_file() else [])
            if record.get("step") is None or (last_step is not None and record["step"] <= last_step)
        ]
        partial = path.with_suffix(".jsonl.tmp")
        partial.write_text("".join(json.dumps(record) + "\n" for record in kept), encoding="utf-8")
        partial.replace(path)  # whole or not at all: a crash here leaves the old file
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run's life, closed by finish()
        self._pending = 0

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records a LocalTracker wrote, from its run folder or its ``metrics.jsonl``.

    Example::

        losses = [r["loss"] for r in read_metrics("runs/my_run") if "loss" in r]
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No local tracker metrics at {path}: pass a run folder or its {METRICS_FILE}.")
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                # A run killed mid-write leaves at most one torn last line; anything else is damage.
                if handle.readline() == "":
                    break
                raise ValueError(f"{path}:{number} is not valid JSON.") from None
    return records


def logged_metrics(record: dict[str, Any]) -> dict[str, Any]:
    """One record's metrics under the names they were logged with: without the tracker's ``step`` and ``time``,
    and with ``metric:step`` / ``metric:time`` back as ``step`` / ``time``.

    Example::

        for record in read_metrics("runs/glue"):
            print(record["step"], logged_metrics(record))  # 10 {'accuracy': 0.5, 'epoch': 0, 'step': 10}
    """
    return {logged_name(key): value for key, value in record.items() if key not in RESERVED}


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The configuration a LocalTracker stored, from its run folder or its ``config.json``."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    return json.loads(path.read_text(encoding="utf-8"))
