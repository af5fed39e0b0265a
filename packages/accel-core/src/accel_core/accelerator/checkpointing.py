"""The Accelerator's checkpoints, routed to accel-checkpoint.

Core only knows the protocols (``accel_core.protocols``): accel-checkpoint's handler is found through
its entry point when first used (a missing one is an ImportError naming it) and is handed the
Accelerator as a ``CheckpointAccelerator``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from .. import discovery
from ..stall_report import watched

if TYPE_CHECKING:
    from ..configuration import ProjectConfiguration
    from ..protocols import CheckpointAccelerator, CheckpointHandler, ResumePoint
    from .process_control import ProcessControl


class Checkpointing:
    """Save and restore everything prepared, through accel-checkpoint's ``CheckpointHandler``.

    accelerator: what the handler is given (``protocols.CheckpointAccelerator``). process: the Accelerator's
    process view (which process writes ``save``'s file). project_configuration: automatic naming and
    ``save_on_each_node``. It keeps the save / load pre-hooks (under the reference's dict names on the
    Accelerator: ``_save_model_state_pre_hook``, ``_load_model_state_pre_hook``).
    """

    def __init__(
        self,
        accelerator: CheckpointAccelerator,
        process: ProcessControl,
        project_configuration: ProjectConfiguration,
    ) -> None:
        self._accelerator = accelerator
        self._process = process
        self._project_configuration = project_configuration
        self.save_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self.load_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()

    @staticmethod
    def _handler() -> CheckpointHandler:
        return discovery.load("accel.checkpoint", "state")

    @watched("save_state")
    def save_state(self, output_dir: str | os.PathLike[str] | None, **kwargs: Any) -> str:
        """The handler's ``save_state``; returns the folder written."""
        return self._handler().save_state(
            self._accelerator, None if output_dir is None else os.fspath(output_dir), **kwargs
        )

    @watched("load_state")
    def load_state(self, input_dir: str | os.PathLike[str] | None, **kwargs: Any) -> str | None:
        """The handler's ``load_state``; returns the folder loaded."""
        return self._handler().load_state(
            self._accelerator, None if input_dir is None else os.fspath(input_dir), **kwargs
        )

    def wait(self) -> str | None:
        """Blocks until an asynchronous save is on disk; returns its folder (None if none pending)."""
        if not discovery.is_loaded("accel.checkpoint", "state"):
            return None  # nothing was ever saved through the handler: no need to import it
        return self._handler().wait(self._accelerator)

    def find_resume_point(self) -> ResumePoint | None:
        """The newest automatic checkpoint complete on every process, or None. Collective."""
        return self._handler().find_resume_point(self._accelerator)

    @watched("save_model")
    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike[str], **kwargs: Any) -> None:
        """The handler's ``save_model``: the model's full weights for use outside accel."""
        self._handler().save_model(self._accelerator, model, os.fspath(save_directory), **kwargs)

    def register_hook(self, hooks: OrderedDict[int, Callable[..., None]], hook: Callable[..., None]) -> RemovableHandle:
        """Adds ``hook`` to ``save_hooks`` or ``load_hooks``; the handle removes it."""
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool) -> None:
        """``torch.save`` on the main process only (once per machine with ``save_on_each_node``); safetensors
        through the handler."""
        if safe_serialization:
            self._handler().save_object(self._accelerator, obj, os.fspath(f), safe_serialization=True)
            return
        state = self._process._current_state
        should_write = (
            state.is_local_main_process if self._project_configuration.save_on_each_node else state.is_main_process
        )
        if should_write:
            torch.save(obj, f)
