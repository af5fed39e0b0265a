"""The object registered as ``accel.checkpoint: state``: what ``Accelerator.save_state`` and friends call.

Example (what accel-core does)::

    handler = discovery.load("accel.checkpoint", "state")
    folder = handler.save_state(accelerator, "ckpt", async_save=True)
    handler.wait(accelerator)  # the async write is finished (and complete on disk) after this
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import TYPE_CHECKING, Any

from . import access
from .coordination import Coordinator
from .errors import CheckpointNotFoundError
from .fsio import fsync_wanted
from .layout import read_metadata
from .legacy import legacy_counts
from .load_state import load_state as _load_state
from .load_state import resolve_input_dir
from .save_plan import plan_save
from .writer import PendingSave, run_job

if TYPE_CHECKING:
    from accel_core.protocols import CheckpointAccelerator, ResumePoint


class _PerAccelerator(dict):
    """Accelerator -> value, not keeping the accelerator alive when it can be weakly referenced."""

    def __init__(self) -> None:
        super().__init__()
        self._weak: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def get_for(self, accelerator: object) -> Any:
        try:
            return self._weak.get(accelerator)
        except TypeError:
            return self.get(id(accelerator))

    def set_for(self, accelerator: object, value: Any) -> None:
        try:
            self._weak[accelerator] = value
        except TypeError:
            self[id(accelerator)] = value

    def pop_for(self, accelerator: object) -> Any:
        try:
            return self._weak.pop(accelerator, None)
        except TypeError:
            return self.pop(id(accelerator), None)


class StateCheckpointer:
    """Implements ``accel_core.protocols.CheckpointHandler``."""

    def __init__(self) -> None:
        self._pending = _PerAccelerator()
        self._buffers = _PerAccelerator()
        self._locked = _PerAccelerator()  # the project folder whose lock the accelerator's job holds

    def _lock_project(self, accelerator: CheckpointAccelerator, coord: Coordinator) -> None:
        """Collective, before the first automatic save, load or resume: the main process takes the project folder's
        lock (``project_lock``); another job holding it fails every process with its host and pid."""
        config = accelerator.project_configuration
        if config is None or not config.automatic_checkpoint_naming or not config.project_dir:
            return
        folder = os.path.realpath(config.project_dir)
        if self._locked.get_for(accelerator) == folder:
            return  # every process records the folder alike, after the same agreement
        from . import project_lock

        error: BaseException | None = None
        if accelerator.process_index == 0:
            try:
                project_lock.acquire(folder)
            except (project_lock.ProjectLockedError, OSError) as caught:
                error = caught
        coord.agree(error, f"locking the project folder {folder}")
        self._locked.set_for(accelerator, folder)
        if accelerator.process_index == 0:
            # Not weakly referenceable (TypeError): the lock is freed when the process ends.
            with contextlib.suppress(TypeError):
                weakref.finalize(accelerator, project_lock.release, folder)

    def save_state(
        self,
        accelerator: CheckpointAccelerator,
        output_dir: str | None = None,
        async_save: bool = False,
        safe_serialization: bool = True,
        durable: bool | None = None,
        **kwargs: Any,
    ) -> str:
        """Saves everything prepared or registered; returns the checkpoint folder.

        async_save: return once the state is copied to CPU memory (a strategy's handed-over shards too); files
            and shards are written by a background thread. The checkpoint only counts (has its ``COMPLETE``
            marker) once written; the next save/load or ``wait(accelerator)`` waits for it and raises its error,
            if any.
        safe_serialization: models as safetensors (default) rather than ``pytorch_model.bin``.
        durable: fsync every file before the checkpoint counts, so it also survives a power cut or
            an OS crash (default: on, unless ``ACCEL_CHECKPOINT_FSYNC=0``). Off, the save returns
            once the files are in the page cache; a killed process still never leaves a broken
            "latest" checkpoint, since the folder is renamed into place only when complete.
        Other keyword arguments go to the strategy's ``sharded_state`` (or ``save_sharded``) when it has one.
        """
        self.wait(accelerator)
        durable = fsync_wanted(durable)  # a bad ACCEL_CHECKPOINT_FSYNC fails here, before anything is written
        coord = Coordinator()
        self._lock_project(accelerator, coord)  # before planning: the plan clears the folder's unfinished saves
        from .snapshot import HostBuffers, to_cpu_without_copy

        buffers = None
        if async_save:
            buffers = self._buffers.get_for(accelerator)
            if buffers is None:
                buffers = HostBuffers()
                self._buffers.set_for(accelerator, buffers)
        copy_tensor = buffers.copy if buffers is not None else to_cpu_without_copy
        stage = buffers.stage_state_dict if buffers is not None else None
        job = plan_save(
            accelerator,
            output_dir,
            coord,
            copy_tensor,
            safe_serialization,
            sharded_kwargs=kwargs,
            stage_state_dict=stage,
        )
        job.durable = durable
        config = accelerator.project_configuration
        automatic = job.metadata["iteration"] is not None
        if buffers is not None:
            buffers.synchronize()
            self._pending.set_for(accelerator, PendingSave(job, coord))
            if automatic:
                config.iteration += 1
            return job.final_dir
        folder = run_job(job, coord)
        if automatic:
            config.iteration += 1
        return folder

    def wait(self, accelerator: CheckpointAccelerator) -> str | None:
        """Blocks until the accelerator's async save (if any) is on disk; returns its folder.

        Raises ``CheckpointError`` if that save failed.
        """
        pending = self._pending.pop_for(accelerator)
        return pending.wait() if pending is not None else None

    def find_resume_point(self, accelerator: CheckpointAccelerator) -> ResumePoint | None:
        """The newest automatic checkpoint complete on every process (and what it holds), or None.

        Collective: every process must call it. Unfinished saves (``.partial`` folders, folders
        without the ``COMPLETE`` marker) never count.
        """
        from accel_core.protocols import ResumePoint

        self.wait(accelerator)
        coord = Coordinator()
        self._lock_project(accelerator, coord)
        try:
            folder = resolve_input_dir(accelerator, None, coord)
        except CheckpointNotFoundError:
            return None  # raised alike on every process: the gathered set is the same everywhere
        metadata = read_metadata(folder)
        counts = metadata["counts"] if metadata else legacy_counts(folder)
        return ResumePoint(folder, {k: int(v) for k, v in counts.items() if k != "scaler"})

    def load_state(
        self,
        accelerator: CheckpointAccelerator,
        input_dir: str | None = None,
        allow_unsafe_pickle: bool | None = None,
        load_dataloader_state: bool = True,
        strict: bool = True,
        **kwargs: Any,
    ) -> str:
        """Restores a checkpoint (the newest complete automatic one when ``input_dir`` is None).

        allow_unsafe_pickle: also load files that need full unpickling (trusted legacy files only;
            default: the ``ACCEL_ALLOW_UNSAFE_PICKLE`` environment variable, else refuse).
        load_dataloader_state: restore the dataloaders' positions (needs the same number of processes).
        strict: passed to the models' ``load_state_dict``.
        """
        self.wait(accelerator)
        coord = Coordinator()
        if input_dir is None:
            self._lock_project(accelerator, coord)
        return _load_state(
            accelerator,
            input_dir,
            coord,
            allow_unsafe_pickle=allow_unsafe_pickle,
            load_dataloader_state=load_dataloader_state,
            strict=strict,
            **kwargs,
        )

    def save_model(
        self,
        accelerator: CheckpointAccelerator,
        model: Any,
        save_directory: str,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Writes the model's full weights (gathered if sharded) as safetensors shards + index."""
        from .model_files import write_model_files

        if os.path.isfile(save_directory):
            raise ValueError(f"save_model: {save_directory} is a file; give a folder path.")
        self.wait(accelerator)
        coord = Coordinator()
        state_dict = full_model_state_dict(accelerator, model)  # every process: it may gather
        config = accelerator.project_configuration
        rank = accelerator.process_index
        writes = rank == 0 or (config.save_on_each_node and accelerator.is_local_main_process)
        error: BaseException | None = None
        if writes:
            try:
                write_model_files(state_dict, save_directory, max_shard_size, safe_serialization)
            except (ValueError, TypeError, OSError) as caught:
                error = caught
        coord.agree(error, f"save_model to {save_directory}")

    def save_object(self, accelerator: CheckpointAccelerator, obj: Any, f: str, safe_serialization: bool) -> None:
        """``accelerator.save``: ``user_io.save`` with the accelerator's ``save_on_each_node``."""
        from .user_io import save

        save(obj, f, accelerator.project_configuration.save_on_each_node, safe_serialization)


def full_model_state_dict(accelerator: CheckpointAccelerator, model: Any) -> dict[str, Any]:
    """The whole model's state dict; a DTensor-sharded model is gathered (onto the CPU) with DCP's helper."""
    state = access.model_state_dict(accelerator, model)
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return state
    if any(isinstance(v, DTensor) for v in state.values()):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state


HANDLER = StateCheckpointer()
