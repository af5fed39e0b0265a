"""How this package reads the Accelerator and its strategy.

Everything accel-checkpoint needs from accel-core goes through these few functions, so a change of
contract is one edit here. The strategy is asked what ``accel_core.strategies.base`` declares
(``model_state_dict``, ``load_model_state_dict``, ``ShardedCheckpointing``); prepared objects are
read from the Accelerator's public ``prepared`` (``PreparedObjects``).
"""

from __future__ import annotations

from typing import Any


def model_state_dict(accelerator: Any, model: Any) -> dict[str, Any]:
    """The full state dict of a prepared model, in its own dtypes (all processes call it: it may gather)."""
    return accelerator.strategy.model_state_dict(model)


def load_model_state_dict(accelerator: Any, model: Any, state_dict: dict[str, Any], strict: bool = True) -> Any:
    """Loads full weights into a prepared model through its strategy (shards keep their part)."""
    return accelerator.strategy.load_model_state_dict(model, state_dict, strict=strict)


def raw_optimizer(optimizer: Any) -> Any:
    """The user's optimizer inside an AcceleratedOptimizer (its state_dict is the same either way)."""
    return getattr(optimizer, "optimizer", optimizer)


def optimizer_owner(optimizer: Any, models: Any) -> Any:
    """The model whose parameters ``optimizer`` updates (sharded optimizer state is keyed by its names)."""
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in models:
        if any(id(p) in ids for p in model.parameters()):
            return model
    raise ValueError(
        f"{type(optimizer).__name__} updates none of the prepared models' parameters, so its sharded state cannot be "
        "saved: prepare the model and its optimizer together (accelerator.prepare(model, optimizer))."
    )


def process_index(accelerator: Any) -> int:
    return int(getattr(accelerator, "process_index", 0))


def num_processes(accelerator: Any) -> int:
    return int(getattr(accelerator, "num_processes", 1))


def is_local_main(accelerator: Any) -> bool:
    value = getattr(accelerator, "is_local_main_process", None)
    if value is None:
        state = getattr(accelerator, "state", None)
        value = getattr(state, "is_local_main_process", process_index(accelerator) == 0)
    return bool(value)


def project_configuration(accelerator: Any) -> Any:
    return getattr(accelerator, "project_configuration", None)


def hooks(accelerator: Any, name: str) -> list[Any]:
    registry = getattr(accelerator, name, None)
    return list(registry.values()) if registry else []


_PREPARED = {
    "_models": "models",
    "_optimizers": "optimizers",
    "_schedulers": "schedulers",
    "_dataloaders": "dataloaders",
    "_custom_objects": "custom_objects",
}


def listed(accelerator: Any, name: str) -> list[Any]:
    """The prepared objects of one kind (``"_models"``, ``"_optimizers"``, ...), in ``prepare`` order."""
    return list(getattr(accelerator.prepared, _PREPARED[name]))


def data_parallel_size(accelerator: Any) -> int:
    """Processes that read different batches (the mesh's ``dp``): dataloader positions are per data-parallel rank."""
    return int(accelerator.parallel_dims.dp.size)
