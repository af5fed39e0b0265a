"""How this package reads the Accelerator and its strategy: by attribute, with fallbacks.

Everything accel-checkpoint needs from accel-core goes through these few functions, so a change of
contract is one edit here, and objects that only answer part of the contract (a plain module, a
strategy without a capability) still work.
"""

from __future__ import annotations

from typing import Any


def strategy_of(accelerator: Any) -> Any:
    return getattr(accelerator, "strategy", None)


def unwrap(accelerator: Any, model: Any) -> Any:
    strategy = strategy_of(accelerator)
    for owner in (strategy, accelerator):
        fn = getattr(owner, "unwrap_model", None)
        if callable(fn):
            return fn(model)
    return model


def model_state_dict(accelerator: Any, model: Any) -> dict[str, Any]:
    """The full state dict of a prepared model, in its own dtypes (all processes call it: it may gather)."""
    strategy = strategy_of(accelerator)
    fn = getattr(strategy, "model_state_dict", None)
    if callable(fn):
        return fn(model)
    fn = getattr(accelerator, "get_state_dict", None)
    if callable(fn):
        return fn(model)
    return unwrap(accelerator, model).state_dict()


def load_model_state_dict(accelerator: Any, model: Any, state_dict: dict[str, Any], strict: bool = True) -> Any:
    strategy = strategy_of(accelerator)
    fn = getattr(strategy, "load_model_state_dict", None)
    if callable(fn):
        return fn(model, state_dict)
    return unwrap(accelerator, model).load_state_dict(state_dict, strict=strict)


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


def listed(accelerator: Any, name: str) -> list[Any]:
    return list(getattr(accelerator, name, None) or [])
