"""The blocking half of ``save_state``: decide where to write, and take a snapshot of all state.

Produces a ``SaveJob``: the list of files this process writes (with their content already in CPU
memory) plus the metadata. ``writer.run_job`` writes it, now or on a background thread.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from typing import TYPE_CHECKING, Any

from accel_core.checkpointing import HandsOverShardedState, ShardedState

from . import access, layout
from . import constants as C
from .checkpoint_io import SafeCheckpointIO
from .coordination import Coordinator
from .data_state import dataloader_state
from .errors import CheckpointError, write_error
from .fsio import remove_tree, token
from .optimizer_state import optimizer_class
from .rng import capture_rng_state
from .safetensors_io import dedupe, safetensors_metadata
from .sharded import MODELS, OPTIMIZERS, SCHEDULERS, find_sharded
from .snapshot import CopyFn, copy_tree

if TYPE_CHECKING:
    from collections.abc import Callable

    from accel_core.protocols import CheckpointAccelerator


logger = logging.getLogger(__name__)


@dataclass
class FileJob:
    """One file of the checkpoint: ``kind`` is ``safetensors`` (dict of tensors) or ``torch`` (any plain data)."""

    name: str
    kind: str
    payload: Any
    metadata: dict[str, str] | None = None


@dataclass
class SaveJob:
    final_dir: str
    temp_dir: str
    files: list[FileJob]
    metadata: dict[str, Any]
    finalizer: bool  # the process that created this folder: writes metadata + marker, renames, prunes
    replace_existing: bool
    prune_base: str | None = None
    total_limit: int | None = None
    durable: bool = True  # fsync every file before the checkpoint counts (survives a power cut)
    sharded: ShardedState | None = None  # the DCP shards a strategy handed over (copied to CPU for async saves)
    group: Any = None  # the process group their collective write runs on (the coordinator's)
    strategy_wrote: bool = False  # the escape hatch: a backend wrote into sharded/ while planning
    written: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)  # digests of the files written, taken while writing


@functools.cache
def _version(dist_name: str) -> str | None:
    try:
        return importlib_metadata.version(dist_name)
    except importlib_metadata.PackageNotFoundError:
        return None


def resolve_output_dir(accelerator: CheckpointAccelerator, output_dir: str | None) -> tuple[str, bool, int | None]:
    """(final folder, replace an existing one?, automatic number or None). Raises ValueError with the fix."""
    config = accelerator.project_configuration
    if config is not None and config.automatic_checkpoint_naming:
        if not config.project_dir:
            raise ValueError(
                "automatic_checkpoint_naming=True needs a project directory: "
                "Accelerator(project_config=ProjectConfiguration(project_dir='runs/exp', "
                "automatic_checkpoint_naming=True))."
            )
        if output_dir is not None:
            logger.warning("save_state: automatic_checkpoint_naming is on, so output_dir=%r is ignored.", output_dir)
        final = layout.numbered_path(config.project_dir, config.iteration)
        if os.path.exists(final):
            raise ValueError(
                f"Checkpoint directory {final} ({config.iteration}) already exists. Please manually override "
                "`accelerator.project_configuration.iteration` with what iteration to start with."
            )
        return os.path.abspath(final), False, config.iteration
    if output_dir is None:
        raise ValueError(
            "save_state() needs an output_dir, or automatic naming: "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    final = os.path.abspath(os.path.expanduser(output_dir))
    if os.path.isfile(final):
        raise ValueError(f"save_state output_dir {final} is a file; give a folder path.")
    return final, True, None


def create_partial_folders(coord: Coordinator, final: str, temp: str, tag: str, automatic: bool) -> int:
    """Creates the hidden folder(s) being written, one per distinct folder; returns this process's leader.

    Collective. Processes may write to one shared folder, to the same path on separate disks (no
    shared file system), or each to a path of its own: which processes share a folder is found
    by looking, not from the paths. Process 0 creates its folder; every process that cannot see
    its own yet waits for the next round, where the lowest of them creates its folder; and so on.
    The creator of a folder (its leader) completes it. One round when the file system is shared.
    """
    leader: int | None = None
    creator = 0
    while True:
        error: BaseException | None = None
        if coord.rank == creator:
            try:
                parent = os.path.dirname(final)
                os.makedirs(parent, exist_ok=True)
                # Leftovers of interrupted saves (never this save's own folders, whatever their path);
                # in the automatic folder every hidden folder is ours.
                layout.remove_leftovers(parent, only_for=None if automatic else os.path.basename(final), keep_tag=tag)
                os.makedirs(temp)
            except OSError as caught:
                error = write_error(caught, final)  # names the checkpoint, not the hidden folder
        coord.agree(error, f"creating checkpoint {final}")
        if leader is None and os.path.isdir(temp):
            leader = creator
        waiting = [rank for rank, without in enumerate(coord.gather(leader is None)) if without]
        if not waiting:
            assert leader is not None
            return leader
        creator = waiting[0]


def plan_save(
    accelerator: CheckpointAccelerator,
    output_dir: str | None,
    coord: Coordinator,
    copy_tensor: CopyFn,
    safe_serialization: bool = True,
    sharded_kwargs: dict[str, Any] | None = None,
    stage_state_dict: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> SaveJob:
    """Collective: every process calls it. Creates the temporary folder and snapshots the state.

    copy_tensor: how a tensor of the files this package writes is snapshotted; stage_state_dict: how a
    handed-over DCP state dict is (None: not at all, for a synchronous save that writes it at once)."""
    config = accelerator.project_configuration
    final, replace, number = None, False, None
    error: BaseException | None = None
    try:
        final, replace, number = resolve_output_dir(accelerator, output_dir)
    except Exception as caught:  # noqa: BLE001 - raised on every process by agree()
        error = caught
    coord.agree(error, "save_state")
    assert final is not None

    rank = accelerator.process_index
    world = accelerator.num_processes
    save_on_each_node = config.save_on_each_node

    tag = coord.broadcast(token() if rank == 0 else None)
    temp = layout.partial_path(final, tag)
    leader = create_partial_folders(coord, final, temp, tag, automatic=number is not None)
    # Files shared by all processes are written once per folder, never twice to one path: by
    # process 0, and by the first process of each other folder when it is a copy on another
    # machine's disk with save_on_each_node, or a folder of its own (a different path).
    first_final = coord.broadcast(final if rank == 0 else None)
    is_writer = leader == rank and (rank == 0 or save_on_each_node or final != first_final)

    models = access.listed(accelerator, "_models")
    covered: set[str] = set()
    sharded_info = None
    sharded = find_sharded(accelerator)
    if sharded is not None and any(coord.gather(leader != 0)):
        # Every process writes its shards and process 0 the index of all of them: one folder.
        if leader == rank:
            remove_tree(temp)
        raise CheckpointError(
            f"save_state: sharded state ({sharded[1]}) must be saved to one folder that every process sees "
            "(a shared file system); give every process the same path on it."
        )
    handed: ShardedState | None = None
    if sharded is not None:
        implementation, name = sharded
        folder = os.path.join(temp, C.SHARDED_DIR)
        if isinstance(implementation, HandsOverShardedState):  # accel-checkpoint writes it, in run_job
            handed = implementation.sharded_state(accelerator.prepared, **(sharded_kwargs or {}))
            covered = set(handed.covers)
            os.makedirs(folder, exist_ok=True)  # every process: its FileJobs may land in it
            stage = stage_state_dict or (lambda state: state)
            handed = ShardedState(dcp={key: stage(value) for key, value in handed.dcp.items()}, files=handed.files)
        else:  # the escape hatch: the backend's library writes its own files now
            covered = set(
                implementation.save_sharded(
                    accelerator.prepared, folder, io=SafeCheckpointIO(coord), **(sharded_kwargs or {})
                )
                or ()
            )
        unknown = covered - {MODELS, OPTIMIZERS, SCHEDULERS}
        if unknown:
            raise CheckpointError(f"{name}.save_sharded returned unknown categories {sorted(unknown)}.")
        sharded_info = {"implementation": name, "covers": sorted(covered)}

    weights = [] if MODELS in covered else [access.model_state_dict(accelerator, m) for m in models]
    files: list[FileJob] = []
    optimizers: list[Any] = []
    schedulers: list[Any] = []
    customs: list[Any] = []
    loaders: list[Any] = []
    scaler: Any = None
    try:
        listed = access.hook_models(accelerator, models)
        for hook in accelerator.save_state_pre_hooks:
            hook(listed, weights, temp)  # hooks write extra files into the folder being built

        optimizers = [] if OPTIMIZERS in covered else access.listed(accelerator, "_optimizers")
        schedulers = [] if SCHEDULERS in covered else access.listed(accelerator, "_schedulers")
        customs = access.listed(accelerator, "_custom_objects")
        loaders = access.listed(accelerator, "_dataloaders")
        scaler = accelerator.scaler

        if is_writer:
            for i, weight in enumerate(weights):
                if safe_serialization:
                    unique, aliases = dedupe(weight)
                    name = C.indexed(C.MODEL_NAME, i, C.SAFE_MODEL_EXT)
                    tensors = {k: copy_tensor(f"{name}/{k}", v) for k, v in unique.items()}
                    files.append(FileJob(name, "safetensors", tensors, safetensors_metadata(aliases)))
                else:
                    name = C.indexed(C.PICKLE_MODEL_NAME, i, ".bin")
                    files.append(FileJob(name, "torch", copy_tree(dict(weight), copy_tensor, name)))
            for i, optimizer in enumerate(optimizers):
                name = C.indexed(C.OPTIMIZER_NAME, i, ".bin")
                files.append(FileJob(name, "torch", copy_tree(optimizer.state_dict(), copy_tensor, name)))
            for i, scheduler in enumerate(schedulers):
                name = C.indexed(C.SCHEDULER_NAME, i, ".bin")
                files.append(FileJob(name, "torch", copy_tree(scheduler.state_dict(), copy_tensor, name)))
            if scaler is not None:
                files.append(
                    FileJob(C.SCALER_NAME, "torch", copy_tree(scaler.state_dict(), copy_tensor, C.SCALER_NAME))
                )
            for i, obj in enumerate(customs):
                name = C.custom_file(i)
                files.append(FileJob(name, "torch", copy_tree(obj.state_dict(), copy_tensor, name)))
        if handed is not None:  # a strategy's plain files (FSDP's gathered optimizer state), by the process given them
            for file_name, obj in handed.files.items():
                name = f"{C.SHARDED_DIR}/{file_name}"
                files.append(FileJob(name, "torch", copy_tree(obj, copy_tensor, name)))
        # Per process: its RNG streams and its dataloaders' positions (each process reads its own shard).
        files.append(FileJob(C.rng_file(rank), "torch", capture_rng_state()))
        for i, loader in enumerate(loaders):
            name = C.dataloader_file(i, rank)
            files.append(FileJob(name, "torch", copy_tree(dataloader_state(loader), copy_tensor, name)))

    except Exception as caught:  # noqa: BLE001 - a failing hook or state_dict on one process must fail all of them
        error = caught
    try:
        coord.agree(error, "taking the checkpoint snapshot")
    except BaseException:
        if leader == rank:
            remove_tree(temp)
        raise

    metadata = {
        "format": C.FORMAT_NAME,
        "format_version": C.FORMAT_VERSION,
        "versions": {
            "accel-checkpoint": _version("accel-checkpoint"),
            "accel-core": _version("accel-core"),
            "torch": _version("torch"),
        },
        "world_size": world,
        "data_parallel_size": access.data_parallel_size(accelerator),
        "created_unix": time.time(),
        "counts": {
            "models": len(models) if MODELS in covered else len(weights),
            "optimizers": len(access.listed(accelerator, "_optimizers")) if OPTIMIZERS in covered else len(optimizers),
            "schedulers": len(access.listed(accelerator, "_schedulers")) if SCHEDULERS in covered else len(schedulers),
            "dataloaders": len(loaders),
            "custom_objects": len(customs),
            "scaler": scaler is not None,
        },
        "model_format": "safetensors" if safe_serialization else "torch",
        # The classes, so that loading into another optimizer class names both (not torch's KeyError: 'betas').
        "optimizer_classes": [optimizer_class(o) for o in access.listed(accelerator, "_optimizers")],
        "sharded": sharded_info,
        "step": accelerator.step,
        # Completed optimizer steps and the last logged step: what auto-resume continues from.
        "progress": accelerator.training_progress(),
        "iteration": number,
        "save_on_each_node": save_on_each_node,
    }
    total_limit = getattr(config, "total_limit", None) if number is not None else None
    return SaveJob(
        final_dir=final,
        temp_dir=temp,
        files=files,
        metadata=metadata,
        finalizer=leader == rank,
        replace_existing=replace,
        prune_base=os.path.dirname(final) if number is not None else None,
        total_limit=total_limit,
        sharded=handed if handed is not None and handed.dcp else None,
        group=coord.group,
        strategy_wrote=sharded is not None and handed is None,
    )
