"""``save_state`` / ``load_state`` under DeepSpeed: the engine's own checkpoint inside accel-checkpoint's folder.

accel-checkpoint calls ``save_sharded`` with the checkpoint's ``sharded/`` folder and a ``CheckpointIO`` (see
``accel_core.checkpointing``) and writes everything else around it (RNG,
dataloader positions, torch schedulers, custom objects, metadata, the completion marker). Layout::

    <checkpoint>/sharded/model_<i>/...       engine.save_checkpoint(tag="model_<i>"): weights, ZeRO
                                             optimizer partitions (one file per process), DeepSpeed's
                                             scheduler, engine counters
    <checkpoint>/sharded/latest, zero_to_fp32.py   written by DeepSpeed: ``python zero_to_fp32.py
                                             sharded out_dir --tag model_0`` rebuilds fp32 weights
    <checkpoint>/sharded/model_<i>.pt        a frozen model prepared next to the engine (its state dict)
    <checkpoint>/sharded/universal/model_<i>/ written on the first load by another number of processes:
                                             DeepSpeed's universal checkpoint of it (``resharding.py``)

DeepSpeed writes its files with pickle and reads them with full unpickling. Before loading, every
file is checked to import nothing but plain data and DeepSpeed's own checkpoint classes (listed
below); anything else is refused unless the user opted in (``io.allow_unsafe_pickle``: ``load_state``'s
``allow_unsafe_pickle`` or ``ACCEL_ALLOW_UNSAFE_PICKLE=1``).
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any

import torch

from accel_core.checkpointing import MODELS, OPTIMIZERS, SCHEDULERS, CheckpointMismatchError, UnsafeCheckpointError

if TYPE_CHECKING:
    from accel_core.checkpointing import CheckpointIO
    from accel_core.strategies import PreparedObjects

# Globals that DeepSpeed 0.16-0.19 checkpoints reference beyond torch's weights-only set: its
# own plain data classes and enums (no code runs when they are rebuilt).
DEEPSPEED_CHECKPOINT_GLOBALS = frozenset(
    {
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        "deepspeed.utils.tensor_fragment.fragment_address",
        "collections.OrderedDict",
        "builtins.set",
        "builtins.frozenset",
        "builtins.slice",
        "torch.device",
    }
)


def _tag(index: int) -> str:
    return f"model_{index}"


def save_sharded(
    engine: Any,
    engine_owns_scheduler: bool,
    is_main_process: bool,
    prepared: PreparedObjects,
    folder: str,
    **kwargs: Any,
) -> set[str]:
    """Collective. Writes each prepared model (``engine`` through DeepSpeed, frozen models by the main process);
    returns the categories covered (the scheduler's when the engine steps it)."""
    os.makedirs(folder, exist_ok=True)
    covered = {MODELS}
    for index, model in enumerate(prepared.models):
        if model is engine:
            os.makedirs(os.path.join(folder, _tag(index)), exist_ok=True)
            model.save_checkpoint(folder, tag=_tag(index), **kwargs)
            if model.optimizer is not None:
                covered.add(OPTIMIZERS)
            if engine_owns_scheduler:
                covered.add(SCHEDULERS)
        elif is_main_process:
            torch.save(model.state_dict(), os.path.join(folder, f"{_tag(index)}.pt"))
    return covered


def load_sharded(
    engine: Any, is_local_main_process: bool, prepared: PreparedObjects, folder: str, io: CheckpointIO
) -> None:
    """Collective. Restores what ``save_sharded`` wrote into the prepared ``engine`` and frozen models."""
    for index, model in enumerate(prepared.models):
        if model is engine:
            path = os.path.join(folder, _tag(index))
            if not os.path.isdir(path):
                raise CheckpointMismatchError(
                    f"{path} is missing: the checkpoint has no DeepSpeed engine at position {index}. Prepare the same "
                    "models, in the same order, as in the run that saved it."
                )
            check_pickles(path, io.allow_unsafe_pickle)
            loaded = _load_engine(is_local_main_process, model, folder, _tag(index), io)
            if loaded is None:
                raise CheckpointMismatchError(f"DeepSpeed could not load its checkpoint from {path}.")
        else:
            path = os.path.join(folder, f"{_tag(index)}.pt")
            if not os.path.isfile(path):
                raise CheckpointMismatchError(
                    f"{path} is missing: prepare the same models, in the same order, as when saving."
                )
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def _load_engine(is_local_main_process: bool, engine: Any, folder: str, tag: str, io: CheckpointIO) -> Any:
    """engine.load_checkpoint; through a universal checkpoint when another number of processes saved it."""
    from .resharding import current_process_count, loading_universal, saved_process_count, universal_checkpoint

    saved = saved_process_count(os.path.join(folder, tag))
    if saved is None or saved == current_process_count(engine):
        loaded, _ = engine.load_checkpoint(folder, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
        return loaded
    root = universal_checkpoint(is_local_main_process, engine, folder, tag, saved, io)
    check_pickles(os.path.join(root, tag), io.allow_unsafe_pickle)
    with loading_universal(engine):
        loaded, _ = engine.load_checkpoint(root, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True)
    return loaded


def check_pickles(path: str, unsafe_allowed: bool) -> None:
    """Refuses DeepSpeed checkpoint files that would import anything outside ``DEEPSPEED_CHECKPOINT_GLOBALS``,
    unless ``unsafe_allowed`` (the user's opt-in, ``CheckpointIO.allow_unsafe_pickle``)."""
    if unsafe_allowed:
        return
    finder = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if finder is None:  # torch < 2.5 cannot inspect a file without loading it
        raise UnsafeCheckpointError(
            f"Cannot check {path} without unpickling it on this torch version: pass allow_unsafe_pickle=True to "
            "load_state (or set ACCEL_ALLOW_UNSAFE_PICKLE=1) if you trust the checkpoint."
        )
    for file in sorted(glob.glob(os.path.join(path, "**", "*.pt"), recursive=True)):
        unexpected = sorted(set(finder(file)) - DEEPSPEED_CHECKPOINT_GLOBALS)
        if unexpected:
            raise UnsafeCheckpointError(
                f"Refused to load {file}: besides DeepSpeed's checkpoint data it would import {', '.join(unexpected)}, "
                "which could run code. If you trust this checkpoint: load_state(..., allow_unsafe_pickle=True) or set "
                "ACCEL_ALLOW_UNSAFE_PICKLE=1."
            )
