"""accel-data: sharding, dispatch, end-of-data accounting and exact resume for PyTorch DataLoaders.

Usable on its own (no Accelerator needed)::

    from accel_data import prepare_data_loader
    loader = prepare_data_loader(DataLoader(dataset, batch_size=32, shuffle=True))

Names are imported lazily so that ``import accel_data`` does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "prepare_data_loader": "prepare",
    "skip_first_batches": "prepare",
    "DataLoaderShard": "loader",
    "DataLoaderDispatcher": "dispatcher_check",
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
    "DataLoaderDispatcher",
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
    from .dispatcher_check import DataLoaderDispatcher
    from .loader import DataLoaderShard, ShardedLoaderMixin
    from .prepare import prepare_data_loader, skip_first_batches
    from .rng import synchronize_rng_states
    from .samplers import BatchSamplerShard, SeedableRandomSampler
    from .sharding import ShardPlan, batches_for_process, iter_groups


__getattr__, __dir__ = lazy_exports(globals(), {n: f".{m}" for n, m in _EXPORTS.items()})
