"""Sharded checkpoints: which implementation saves a run's sharded state, and a DCP-based default.

A strategy whose models or optimizers are split across processes hands its state over by implementing
``HandsOverShardedState`` (FSDP): accel-checkpoint writes it (``writer``), with everything else, in the
same crash-safe folder. A backend whose library must write its own files (DeepSpeed, Megatron, torch-xla)
implements the escape hatch ``ShardedCheckpointing`` instead. Both are declared with the rest of the
checkpoint contract in ``accel_core.checkpointing`` and checked with ``isinstance``, never a backend's name;
loading hands the strategy a ``CheckpointIO`` (``checkpoint_io.SafeCheckpointIO``: safe loading, agreement
between processes), so a backend never imports this package.

Models whose parameters are DTensors (FSDP2 ``fully_shard``, tensor parallel) and whose strategy
implements neither are saved with ``DCPCheckpointing``: each process's shards as a
``torch.distributed.checkpoint`` state dict; no process ever holds the whole model. DCP reshards
on load, so a checkpoint of one layout (tensor parallel x FSDP2) loads on another (FSDP2 alone,
or one process with plain tensors).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from accel_core.checkpointing import (
    MODELS,
    OPTIMIZERS,
    SCHEDULERS,
    CheckpointIO,
    HandsOverShardedState,
    ShardedCheckpointing,
    ShardedState,
)
from accel_core.optimizer import unwrap_optimizer
from accel_core.optimizer_rebuild import optimizer_owner

from .access import listed

if TYPE_CHECKING:
    from accel_core.prepared_model import PreparedModel
    from accel_core.protocols import CheckpointAccelerator
    from accel_core.strategies import PreparedObjects


def _has_dtensor(model: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


__all__ = ["MODELS", "OPTIMIZERS", "SCHEDULERS", "DCPCheckpointing", "ShardedCheckpointing", "find_sharded"]


def dcp_module(prepared: PreparedModel) -> Any:
    """The module DCP reads for a prepared model: a pipelined model's local stage(s) (parameter names as in the whole
    model, so the stages' keys together are the whole model's and load into another pipeline layout)."""
    if prepared.pipeline is None:
        return prepared.runs
    return prepared.pipeline.checkpoint_module()


def _pipelined(prepared: PreparedObjects) -> bool:
    return any(record.pipeline is not None for record in prepared.records)


def _options(prepared: PreparedObjects) -> Any:
    """State-dict options: optimizer state flattened per parameter name when a model is split into pipeline stages."""
    if not _pipelined(prepared):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def find_sharded(
    accelerator: CheckpointAccelerator,
) -> tuple[HandsOverShardedState | ShardedCheckpointing, str] | None:
    """The implementation to use and its name, or None for a plain (full state dict) checkpoint."""
    strategy = accelerator.strategy
    if not strategy.splits_model_itself and _pipelined(accelerator.prepared):
        return DCPCheckpointing(), "dcp"  # torch's pipeline stages each write their own keys, whatever the strategy
    if isinstance(strategy, (HandsOverShardedState, ShardedCheckpointing)):
        return strategy, f"{type(strategy).__module__}.{type(strategy).__qualname__}"
    if any(_has_dtensor(m) for m in listed(accelerator, "_models")):
        return DCPCheckpointing(), "dcp"
    return None


class DCPCheckpointing:
    """The default sharded checkpointing (``HandsOverShardedState``): one ``torch.distributed.checkpoint`` folder
    per model/optimizer, written by accel-checkpoint's writer.

    Layout inside the checkpoint: ``sharded/model_<i>/`` (key ``model``) and
    ``sharded/optimizer_<i>/`` (key ``optimizer``). Loading works for another number of processes
    (DCP reshards). ``merge_sharded_checkpoint`` turns ``model_<i>`` into one safetensors file.
    A pipelined model writes each stage's keys (and its optimizer state flattened per parameter,
    so that the stages' groups do not collide): together they are the whole model's.
    """

    def sharded_state(self, prepared: PreparedObjects, **kwargs: Any) -> ShardedState:
        """This process's shards of every prepared model and optimizer. Collective (DCP's state-dict helpers)."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        models = [dcp_module(record) for record in prepared.records]
        options = _options(prepared)
        dcp: dict[str, dict[str, Any]] = {
            f"model_{i}": {"model": get_model_state_dict(model)} for i, model in enumerate(models)
        }
        for i, wrapped in enumerate(prepared.optimizers):
            optimizer = unwrap_optimizer(wrapped)
            state = get_optimizer_state_dict(optimizer_owner(optimizer, models), optimizer, options=options)
            dcp[f"optimizer_{i}"] = {"optimizer": state}
        return ShardedState(dcp=dcp, covers=(MODELS, OPTIMIZERS))

    def save_sharded(
        self, prepared: PreparedObjects, folder: str, *, io: CheckpointIO | None = None, **kwargs: Any
    ) -> Collection[str]:
        """For a strategy that keeps the escape hatch (``ShardedCheckpointing``) and delegates here: writes
        ``sharded_state`` into ``folder`` now, with accel-checkpoint's writer. Collective."""
        from .dcp_write import write_sharded_state

        state = self.sharded_state(prepared)
        write_sharded_state(state, folder, durable=True)
        return state.covers

    def load_sharded(
        self,
        prepared: PreparedObjects,
        folder: str,
        *,
        io: CheckpointIO | None = None,
        allow_unsafe_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Collective. Without ``io`` (a strategy delegating here that leaves it out), the folder is read with
        this package's safe loading under ``allow_unsafe_pickle``."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if io is None:
            from .checkpoint_io import SafeCheckpointIO
            from .coordination import Coordinator

            io = SafeCheckpointIO(Coordinator(), allow_unsafe_pickle)

        def read(state: dict[str, Any], path: str) -> None:
            if not os.path.isdir(path):
                from .errors import CheckpointMismatchError

                raise CheckpointMismatchError(
                    f"{path} is missing: the checkpoint holds fewer sharded objects than were prepared."
                )
            io.load_dcp(state, path)

        models = [dcp_module(record) for record in prepared.records]
        options = _options(prepared)
        for i, model in enumerate(models):
            state = {"model": get_model_state_dict(model)}
            read(state, os.path.join(folder, f"model_{i}"))
            set_model_state_dict(model, state["model"])
        for i, wrapped in enumerate(prepared.optimizers):
            optimizer = unwrap_optimizer(wrapped)
            owner = optimizer_owner(optimizer, models)
            state = {"optimizer": get_optimizer_state_dict(owner, optimizer, options=options)}
            read(state, os.path.join(folder, f"optimizer_{i}"))
            set_optimizer_state_dict(owner, optimizer, state["optimizer"], options=options)
