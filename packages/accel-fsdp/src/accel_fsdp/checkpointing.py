"""Sharded checkpoints for the ``HandsOverShardedState`` protocol (``accel_core.checkpointing``), and full state dicts.

accel-fsdp hands its state over (``sharded_state``); accel-checkpoint writes it. Layout inside the checkpoint's
``sharded/`` folder (the same as its DCP default, so ``merge_sharded_checkpoint`` reads it):

- SHARDED_STATE_DICT: ``model_<i>/`` (DCP, key ``model``) and ``optimizer_<i>/`` (DCP, key
  ``optimizer``); every process writes its own shards, nobody holds the whole model, and DCP
  reshards on load, so another number of processes can read it.
- FULL_STATE_DICT: ``optimizer_<i>.bin``, the optimizer state gathered on process 0 (keyed by
  parameter name); the models are written by accel-checkpoint as safetensors from the gathered
  ``model_state_dict``.

Loading looks at what the folder holds, not at the current plugin, so either kind loads. Files are read through
the ``CheckpointIO`` accel-checkpoint hands over (DCP folders and ``torch.save`` files without unpickling code).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from accel_core.checkpointing import MODELS, OPTIMIZERS, CheckpointMismatchError, ShardedState
from accel_core.optimizer import unwrap_optimizer
from accel_core.optimizer_rebuild import optimizer_owner

# torch releases before 2.14 crash gathering a full state dict of an FSDP1 model on the CPU with cpu_offload (below).
_FSDP1_CPU_OFFLOAD_CRASHES = torch.__version__ < "2.14"

if TYPE_CHECKING:
    from accel_core.checkpointing import CheckpointIO
    from accel_core.strategies import PreparedObjects


def full_options(**extra: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**{"full_state_dict": True, "cpu_offload": True, **extra})


def full_model_state_dict(model: nn.Module) -> dict[str, Any]:
    """The whole model's weights on process 0 (CPU tensors); an empty dict on the others. Collective."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if _FSDP1_CPU_OFFLOAD_CRASHES and _fsdp1_on_cpu(model):  # the constant first: no module walk on a newer torch
        # torch < 2.14 crashes (SIGSEGV, in the state dict's clone of each unsharded parameter) gathering an FSDP1
        # model that lives on the CPU with cpu_offload / rank0_only; its weights are on the CPU already, so every
        # process gathers them without the offload and all but process 0 drop them.
        state = get_model_state_dict(model, options=full_options(cpu_offload=False))
        return state if dist.get_rank() == 0 else {}
    return get_model_state_dict(model, options=full_options())


def _fsdp1_on_cpu(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    first = next(model.parameters(), None)
    return (
        first is not None
        and first.device.type == "cpu"
        and any(isinstance(module, FullyShardedDataParallel) for module in model.modules())
    )


def load_full_model_state_dict(model: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> Any:
    """Every process passes the same full state dict; each keeps its shard. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    return set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=strict))


def _resharded(models: Sequence[nn.Module]) -> list[nn.Module]:
    """The models with every FSDP2 unit back in its sharded state.

    A unit that keeps its parameters gathered after forward (``reshard_after_forward=False``) and saw
    a forward without backward exposes the gathered tensors as ``parameters()``; DCP's optimizer
    state functions match the optimizer's (sharded) parameters against those and would not find them.
    """
    from torch.distributed.fsdp import FSDPModule

    for model in models:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
    return list(models)


def sharded_state(prepared: PreparedObjects, state_dict_type: str, is_main_process: bool) -> ShardedState:
    """What accel-checkpoint writes of the models and optimizers: DCP state dicts of this process's shards, or for
    FULL_STATE_DICT the optimizer state gathered onto the main process. Collective."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    models = _resharded(prepared.models)
    optimizers = [unwrap_optimizer(o) for o in prepared.optimizers]
    if state_dict_type == "FULL_STATE_DICT":
        files: dict[str, Any] = {}
        for i, optimizer in enumerate(optimizers):
            state = get_optimizer_state_dict(optimizer_owner(optimizer, models), optimizer, options=full_options())
            if is_main_process:
                files[f"optimizer_{i}.bin"] = state
        return ShardedState(files=files, covers=(OPTIMIZERS,))
    dcp: dict[str, dict[str, Any]] = {
        f"model_{i}": {"model": get_model_state_dict(model)} for i, model in enumerate(models)
    }
    for i, optimizer in enumerate(optimizers):
        dcp[f"optimizer_{i}"] = {"optimizer": get_optimizer_state_dict(optimizer_owner(optimizer, models), optimizer)}
    return ShardedState(dcp=dcp, covers=(MODELS, OPTIMIZERS))


def _missing(path: str) -> Exception:
    return CheckpointMismatchError(
        f"{path} is missing: the checkpoint holds fewer models or optimizers than were prepared. Prepare the same "
        "objects, in the same order, as the run that saved it."
    )


def load(prepared: PreparedObjects, folder: str, io: CheckpointIO) -> None:
    """Restores what ``save`` wrote, on any number of processes (DCP reshards), reading through ``io``. Collective."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    models = _resharded(prepared.models)
    # FULL_STATE_DICT checkpoints have no model folders: accel-checkpoint loads their model files.
    if os.path.isdir(os.path.join(folder, "model_0")):
        for i, model in enumerate(models):
            path = os.path.join(folder, f"model_{i}")
            if not os.path.isdir(path):
                raise _missing(path)
            state = {"model": get_model_state_dict(model)}
            io.load_dcp(state, path)
            set_model_state_dict(model, state["model"])
    for i, wrapped in enumerate(prepared.optimizers):
        optimizer = unwrap_optimizer(wrapped)
        owner = optimizer_owner(optimizer, models)
        sharded, full = os.path.join(folder, f"optimizer_{i}"), os.path.join(folder, f"optimizer_{i}.bin")
        if os.path.isdir(sharded):
            state = {"optimizer": get_optimizer_state_dict(owner, optimizer)}
            io.load_dcp(state, sharded)
            set_optimizer_state_dict(owner, optimizer, state["optimizer"])
        elif os.path.isfile(full):
            from torch.distributed.checkpoint.state_dict import StateDictOptions

            state = io.load_torch_file(full)
            set_optimizer_state_dict(owner, optimizer, state, options=StateDictOptions(full_state_dict=True))
        else:
            raise _missing(sharded)
