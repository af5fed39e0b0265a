"""The tracker base class, the tracker names, and the main-process guard every tracker shares.

Nothing here imports torch or a tracking library: ``import accel_tracking`` must stay cheap, so
each tracker imports its library inside ``__init__`` (through ``require``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, TypeGuard, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

# Where a tracker that writes files puts them when the project has no logging_dir:
# ``./runs`` under the working directory, the folder TensorBoard users already expect.
DEFAULT_LOGGING_DIR = "runs"


class LoggerType(str, Enum):
    """The names of the trackers accel knows (``Accelerator(log_with=LoggerType.TENSORBOARD)``).

    ``ALL`` asks for every installed tracker whose library is importable. ``AIM``, ``TRACKIO``,
    ``CLEARML``, ``DVCLIVE`` and ``SWANLAB`` are the reference's names for trackers accel does not
    ship: asking for one raises an ImportError unless a package registers it (``accel.trackers``
    entry point); pass a ``GeneralTracker`` instance instead.

    Example::

        >>> str(LoggerType.WANDB)
        'wandb'
    """

    ALL = "all"
    LOCAL = "local"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"
    COMETML = "comet_ml"
    AIM = "aim"
    TRACKIO = "trackio"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"

    def __str__(self) -> str:  # the entry-point name, so core can call discovery.load(group, str(x))
        return self.value


def process_index() -> int:
    """This process's global rank, asked without creating a process group or importing torch.

    An initialised ``PartialState`` is the authority when there is one; otherwise an initialised
    ``torch.distributed`` group; otherwise torchrun's ``RANK`` (0 when run alone).
    """
    state_module = sys.modules.get("accel_core.state")
    if state_module is not None and state_module.PartialState.is_initialized():
        return int(state_module.PartialState().process_index)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get("RANK", "0") or 0)


def local_process_index() -> int:
    """This process's rank on its machine, asked the same way as ``process_index``."""
    state_module = sys.modules.get("accel_core.state")
    if state_module is not None and state_module.PartialState.is_initialized():
        return int(state_module.PartialState().local_process_index)
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def is_main_process() -> bool:
    """Whether this is global rank 0 (see ``process_index``)."""
    return process_index() == 0


def _guarded(method: F) -> F:
    """Runs ``method`` only where the tracker is active (main process, unless ``main_process_only=False``)."""
    if getattr(method, "_accel_guarded", False):
        return method

    @functools.wraps(method)
    def wrapper(self: GeneralTracker, *args: Any, **kwargs: Any) -> Any:
        if not _runs_here(self):
            return None
        return method(self, *args, **kwargs)

    wrapper._accel_guarded = True  # pyright: ignore[reportAttributeAccessIssue]  # a marker on the function
    return cast(F, wrapper)


def _runs_here(tracker: GeneralTracker) -> bool:
    # Decided once per instance so a tracker never half-runs if the state changes mid-run.
    active = tracker.__dict__.get("_accel_active")
    if active is None:
        active = (not tracker.main_process_only) or is_main_process()
        tracker.__dict__["_accel_active"] = active
    return bool(active)


_GUARDED_METHODS = ("__init__", "store_init_configuration", "log", "log_images", "log_table", "rewind", "finish")


class GeneralTracker:
    """Base class of every tracker; subclass it to write a custom one.

    A tracker is built as ``cls(run_name, logging_dir, **init_kwargs)`` and must set the class
    attributes ``name`` (str) and ``requires_logging_directory`` (bool). With
    ``main_process_only = True`` (the default) the constructor and every logging method do nothing
    on processes other than global rank 0, so a tracker created on every rank still writes one
    set of logs; ``tracker`` is then ``None`` there.

    Example::

        class PrintTracker(GeneralTracker):
            name = "print"
            requires_logging_directory = False

            def __init__(self, run_name, logging_dir=None):
                self.run_name = run_name

            @property
            def tracker(self):
                return None

            def log(self, values, step=None, **kwargs):
                print(step, values)

        accelerator = Accelerator(log_with=PrintTracker("demo"))
    """

    name: ClassVar[str]
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = True
    # Import name of the third-party library and the pip extra that brings it (None: no dependency).
    library: ClassVar[str | None] = None
    extra: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Guard what the subclass defines itself, so custom trackers get main-process-only for free.
        for method_name in _GUARDED_METHODS:
            method = cls.__dict__.get(method_name)
            if callable(method):
                setattr(cls, method_name, _guarded(method))
        # Where the constructor did not run, the raw object is None rather than an AttributeError.
        raw = cls.__dict__.get("tracker")
        if isinstance(raw, property) and raw.fget is not None:
            guarded = property(_guarded(raw.fget), raw.fset, raw.fdel, raw.__doc__)
            cls.tracker = guarded  # pyright: ignore[reportAttributeAccessIssue]  # replaces the subclass's property

    @classmethod
    def is_available(cls) -> bool:
        """Whether the tracker's library can be imported here (used by ``log_with="all"``)."""
        return cls.library is None or importlib.util.find_spec(cls.library) is not None

    @property
    def is_active(self) -> bool:
        """Whether this process writes (False on non-main ranks of a ``main_process_only`` tracker)."""
        return _runs_here(self)

    @property
    def tracker(self) -> Any:
        """The raw object of the backend (a SummaryWriter, a wandb Run, ...); None where inactive."""
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Records the run's hyperparameters (called once by ``Accelerator.init_trackers``)."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Logs a dict of metrics at ``step``."""
        raise NotImplementedError(f"{type(self).__name__} must implement log(values, step=None, **kwargs).")

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Logs images (``{name: array or list of arrays}``) where the backend has images."""
        raise NotImplementedError(f"The {self.name} tracker cannot log images.")

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Logs a table (rows in ``data`` with ``columns``, or a pandas ``dataframe``) where the backend has tables."""
        raise NotImplementedError(f"The {self.name} tracker cannot log tables.")

    def finish(self) -> None:
        """Closes the run and flushes what is buffered (called by ``Accelerator.end_training``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={getattr(self, 'name', '?')!r}, active={self.is_active})"


def require(library: str, extra: str | None, needed_by: str = "This tracker") -> ModuleType:
    """Imports ``library`` or raises an ImportError naming the accel-tracking extra that installs it.

    needed_by: what needs it, as the message's subject ("This tracker", "Plotting metrics")."""
    try:
        return importlib.import_module(library)
    except ImportError as error:
        package = library.replace("_", "-")
        hint = (
            f'pip install "accel-tracking[{extra}]"  (or pip install {package})' if extra else f"pip install {package}"
        )
        raise ImportError(f"{needed_by} needs `{library}`, which is not installed: {hint}.") from error


def resolve_logging_dir(logging_dir: str | os.PathLike[str] | None, tracker_name: str) -> Path:
    """``logging_dir`` as a Path, or ``./runs`` under the working directory when the project set none.

    A tracker that writes files must write somewhere; ``./runs`` is predictable and is what a
    user of TensorBoard looks in first. Set ``ProjectConfiguration(logging_dir=...)`` to choose.
    """
    if logging_dir is None or str(logging_dir) == "":
        return Path.cwd() / DEFAULT_LOGGING_DIR
    if not isinstance(logging_dir, (str, os.PathLike)):
        raise TypeError(
            f"The {tracker_name} tracker's logging_dir must be a path, got {type(logging_dir).__name__}: "
            "pass ProjectConfiguration(logging_dir='...')."
        )
    return Path(logging_dir)


def make_logging_dir(path: str | os.PathLike[str], tracker_name: str) -> Path:
    """Creates ``path`` (and its parents) for a tracker to write in; returns it as a Path.

    A folder that cannot be created (under a file, in a read-only folder, no space) is a
    ``ValueError`` naming the folder, the reason and the fix, not a raw ``OSError``.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        where = f" ({error.filename})" if error.filename and os.fspath(error.filename) != os.fspath(path) else ""
        if isinstance(error, (FileExistsError, NotADirectoryError)):
            reason = "a file is in the way" if path.exists() or not path.parent.is_dir() else reason
        raise ValueError(
            f"The {tracker_name} tracker cannot create its logging folder {path}: {reason}{where}. Choose a "
            "writable folder with ProjectConfiguration(logging_dir=...) (or project_dir=...)."
        ) from None
    return path


def flatten_dict(values: dict[str, Any], parent: str = "", sep: str = "/") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``: backends that take flat parameters need this."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        full = f"{parent}{sep}{key}" if parent else str(key)
        if isinstance(value, dict):
            flat.update(flatten_dict(value, full, sep))
        else:
            flat[full] = value
    return flat


def to_python_scalar(value: Any) -> Any:
    """A 0-d tensor or numpy scalar as a Python number; anything else unchanged.

    Users log ``loss.item()`` or ``loss`` alike; backends want plain numbers.
    """
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return item()
    if callable(item) and type(value).__module__ == "numpy":
        return item()
    return value


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is a real number a metric backend accepts (bools excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
