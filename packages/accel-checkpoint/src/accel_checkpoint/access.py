"""How this package reads the Accelerator and its strategy.

What accel-checkpoint may read of the Accelerator is declared in accel-core by
``accel_core.protocols.CheckpointAccelerator`` (imported here for type checking only); the reads
several modules share are named here. The strategy is asked what ``accel_core.strategies.base``
declares (``model_state_dict``, ``load_model_state_dict``, ``listed_model``; ``ShardedCheckpointing`` in
``accel_core.checkpointing``); prepared
objects are read from the Accelerator's public ``prepared`` (``PreparedObjects``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from accel_core.protocols import CheckpointAccelerator


def model_state_dict(accelerator: CheckpointAccelerator, model: torch.nn.Module) -> dict[str, Any]:
    """The full state dict of a prepared model, in its own dtypes (all processes call it: it may gather; a model split
    into pipeline stages is gathered over them onto the main process)."""
    from accel_core.strategies.model_state import prepared_model_state_dict

    # Read inside torch.compile's wrapper: a checkpoint holds the model's own keys (``weight``, not
    # ``_orig_mod.weight``), as the reference's save_state writes them, loadable with or without compiling.
    record = accelerator.prepared.record_for(model, accelerator.strategy.unwrap_model)
    return prepared_model_state_dict(accelerator.strategy, record)


def load_model_state_dict(
    accelerator: CheckpointAccelerator, model: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True
) -> Any:
    """Loads full weights into a prepared model through its strategy (shards keep their part; pipeline stages take
    their own keys)."""
    from accel_core.strategies.model_state import load_prepared_model_state_dict

    prefix = "_orig_mod."
    if state_dict and all(key.startswith(prefix) for key in state_dict):  # saved compiled by accel 0.1.0
        state_dict = {key.removeprefix(prefix): value for key, value in state_dict.items()}
    record = accelerator.prepared.record_for(model, accelerator.strategy.unwrap_model)
    return load_prepared_model_state_dict(accelerator.strategy, record, state_dict, strict=strict)


def hook_models(accelerator: CheckpointAccelerator, models: list[Any]) -> list[Any]:
    """What the save- and load-state pre-hooks are given for the prepared ``models``: the models as the reference
    lists them (``Strategy.listed_model`` of each one's record: the user's module, not its DDP wrapper), in a new
    list."""
    strategy = accelerator.strategy
    return [strategy.listed_model(accelerator.prepared.record_for(model, strategy.unwrap_model)) for model in models]


_PREPARED = {
    "_models": "models",
    "_optimizers": "optimizers",
    "_schedulers": "schedulers",
    "_dataloaders": "dataloaders",
    "_custom_objects": "custom_objects",
}


def listed(accelerator: CheckpointAccelerator, name: str) -> list[Any]:
    """The prepared objects of one kind (``"_models"``, ``"_optimizers"``, ...), in ``prepare`` order."""
    return list(getattr(accelerator.prepared, _PREPARED[name]))


def data_parallel_size(accelerator: CheckpointAccelerator) -> int:
    """Processes that read different batches (the mesh's ``dp``): dataloader positions are per data-parallel rank."""
    return int(accelerator.parallel_dims.dp.size)
