"""accel-data: sharding, dispatch, end-of-data accounting and exact resume for PyTorch DataLoaders.

Usable on its own (no Accelerator needed)::

    from accel_data import prepare_data_loader
    loader = prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))

Names are imported lazily so that ``import accel_data`` does not import torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "prepare_data_loader": "prepare",
    "skip_first_batches": "prepare",
    "DataLoaderShard": "loader",
    "ShardedLoaderMixin": "loader",
    "BatchSamplerShard": "samplers",
    "SeedableRandomSampler": "samplers",
    "ShardPlan": "sharding",
    "iter_groups": "sharding",
    "batches_for_process": "sharding",
    "synchronize_rng_states": "rng",
    "DispatchError": "dispatch",
}

__all__ = [
    "BatchSamplerShard",
    "DataLoaderShard",
    "DispatchError",
    "SeedableRandomSampler",
    "ShardPlan",
    "ShardedLoaderMixin",
    "batches_for_process",
    "iter_groups",
    "prepare_data_loader",
    "skip_first_batches",
    "synchronize_rng_states",
]

if TYPE_CHECKING:
    from .dispatch import DispatchError
    from .loader import DataLoaderShard, ShardedLoaderMixin
    from .prepare import prepare_data_loader, skip_first_batches
    from .rng import synchronize_rng_states
    from .samplers import BatchSamplerShard, SeedableRandomSampler
    from .sharding import ShardPlan, batches_for_process, iter_groups


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_data' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
