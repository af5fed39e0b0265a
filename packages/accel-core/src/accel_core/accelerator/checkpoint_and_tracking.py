"""The Accelerator's tracking and checkpoint methods, routed to the packages that implement them.

Core only knows the protocols (``accel_core.protocols``); accel-tracking and accel-checkpoint are
found through entry points when first used, and a missing one is an ImportError naming it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from .. import discovery, ops
from ..configuration import ProjectConfiguration

if TYPE_CHECKING:
    from ..state import AcceleratorState
    from ..strategies import PreparedObjects
    from .nonfinite_guard import NonFiniteGuard


class _InactiveTracker:
    """What ``get_tracker`` returns on processes that do not log: every call does nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tracker = None

    def __getattr__(self, attribute: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


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
    """Mixin of the Accelerator: experiment tracking on the main process."""

    state: AcceleratorState
    project_configuration: ProjectConfiguration
    log_with: list[Any]
    trackers: list[Any]
    wait_for_checkpoint: Callable[[], str | None]  # Checkpointing's, on the same Accelerator
    _nonfinite_guard: NonFiniteGuard | None
    _last_logged_step: int | None  # Resumption's: saved with checkpoints, where a resumed run's trackers rewind to
    _apply_tracker_rewind: Callable[[], None]  # Resumption's

    @property
    def logging_dir(self) -> str | None:
        """``ProjectConfiguration.logging_dir``: where file-writing trackers write."""
        return self.project_configuration.logging_dir

    def init_trackers(
        self, project_name: str, config: dict[str, Any] | None = None, init_kwargs: dict[str, Any] | None = None
    ) -> None:
        """Starts the trackers of ``log_with`` (the local tracker when none was named), main process only.

        init_kwargs: per-tracker constructor arguments, ``{"wandb": {"tags": [...]}}``.
        """
        init_kwargs = init_kwargs or {}
        error: BaseException | None = None
        if self.state.is_main_process:
            try:
                self._start_trackers(project_name, config, init_kwargs)
            except Exception as caught:  # noqa: BLE001 - re-raised below, on every rank
                error = caught
        # A tracker failing on the main process (W&B not logged in, say) must stop every rank,
        # not leave the others waiting at their next collective.
        if self.state.use_distributed:
            message = [None if error is None else f"{type(error).__name__}: {error}"]
            ops.broadcast_object_list(message, from_process=0)
            if message[0] is not None and error is None:
                raise RuntimeError(f"init_trackers failed on the main process: {message[0]}")
        if error is not None:
            raise error

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
        self._apply_tracker_rewind()  # a resumed run continues the checkpoint's run

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its raw library object with ``unwrap=True``)."""
        if not self.state.is_main_process:
            return _InactiveTracker(name)
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ValueError(f"No tracker named {name!r} was started: call init_trackers first, with log_with={name!r}.")

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None) -> None:
        """Logs ``values`` to every started tracker (main process only).

        With ``skip_nonfinite``, steps skipped since the last call add ``train/nonfinite_skips`` (the
        running count) to ``values``.
        """
        if self._nonfinite_guard is not None:
            values = {**values, **self._nonfinite_guard.unlogged()}
        if step is not None:
            last = self._last_logged_step
            self._last_logged_step = int(step) if last is None else max(last, int(step))
        if not self.state.is_main_process:
            return
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def end_training(self) -> None:
        """Waits for a pending asynchronous checkpoint and closes the trackers; call at the end of the script."""
        self.wait_for_checkpoint()
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []


def _tracker_class(name: str) -> Any:
    return discovery.load("accel.trackers", name)


class Checkpointing:
    """Mixin of the Accelerator: save and restore everything prepared, through accel-checkpoint."""

    state: AcceleratorState
    project_configuration: ProjectConfiguration
    prepared: PreparedObjects
    _save_model_state_pre_hook: OrderedDict[int, Callable[..., None]]
    _load_model_state_pre_hook: OrderedDict[int, Callable[..., None]]
    _after_prepare: Callable[[], None]  # Resumption's

    @property
    def project_dir(self) -> str | None:
        """``ProjectConfiguration.project_dir``: the root of automatic checkpoints."""
        return self.project_configuration.project_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatic checkpoint gets (``ProjectConfiguration.iteration``)."""
        return self.project_configuration.iteration

    def save_state(self, output_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> str:
        """Saves models, optimizers, schedulers, scaler, RNG states, dataloader positions and registered objects.

        ``async_save=True`` returns once the state is copied to CPU memory; ``wait_for_checkpoint``
        (also called by the next save or load, ``end_training`` and ``free_memory``) waits for the files.
        """
        handler = discovery.load("accel.checkpoint", "state")
        return handler.save_state(self, None if output_dir is None else os.fspath(output_dir), **kwargs)

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> str | None:
        """Restores what ``save_state`` wrote (the newest automatic checkpoint when ``input_dir`` is None);
        returns the folder loaded."""
        handler = discovery.load("accel.checkpoint", "state")
        return handler.load_state(self, None if input_dir is None else os.fspath(input_dir), **kwargs)

    def wait_for_checkpoint(self) -> str | None:
        """Blocks until an asynchronous ``save_state`` is on disk; returns its folder (None if none pending)."""
        if not discovery.is_loaded("accel.checkpoint", "state"):
            return None  # nothing was ever saved through the handler: no need to import it
        wait = getattr(discovery.load("accel.checkpoint", "state"), "wait", None)
        return wait(self) if wait is not None else None

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike[str], **kwargs: Any) -> None:
        """Writes the model's full weights (safetensors, sharded past ``max_shard_size``) for use outside accel."""
        handler = discovery.load("accel.checkpoint", "state")
        handler.save_model(self, model, os.fspath(save_directory), **kwargs)

    @property
    def save_state_pre_hooks(self) -> list[Callable[..., None]]:
        """The hooks ``register_save_state_pre_hook`` added and not removed, in registration order."""
        return list(self._save_model_state_pre_hook.values())

    @property
    def load_state_pre_hooks(self) -> list[Callable[..., None]]:
        """The hooks ``register_load_state_pre_hook`` added and not removed, in registration order."""
        return list(self._load_model_state_pre_hook.values())

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` runs before ``save_state`` writes the models."""
        handle = RemovableHandle(self._save_model_state_pre_hook)
        self._save_model_state_pre_hook[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` runs before ``load_state`` loads the models."""
        handle = RemovableHandle(self._load_model_state_pre_hook)
        self._load_model_state_pre_hook[handle.id] = hook
        return handle

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Adds objects with ``state_dict`` / ``load_state_dict`` to what ``save_state`` saves."""
        invalid = [o for o in objects if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))]
        if invalid:
            listed = "\n".join(f"\t- item {i}: {type(o).__name__}" for i, o in enumerate(invalid))
            raise ValueError(
                "All objects must have `state_dict` and `load_state_dict` methods to be checkpointed. Invalid:\n"
                + listed
            )
        self.prepared.custom_objects.extend(objects)
        self._after_prepare()

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """``torch.save`` on the main process only (once per machine with ``save_on_each_node``).

        ``safe_serialization=True`` writes a safetensors file through accel-checkpoint (which depends on
        safetensors; accel-core does not), with shared tensors written once.
        """
        if safe_serialization:
            discovery.load("accel.checkpoint", "state").save_object(self, obj, os.fspath(f), safe_serialization=True)
            return
        should_write = (
            self.state.is_local_main_process
            if self.project_configuration.save_on_each_node
            else self.state.is_main_process
        )
        if should_write:
            torch.save(obj, f)
