"""``accel.data_loader``: the prepared dataloaders (``accelerate.data_loader``) under the reference's module path."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "DataLoaderShard": "accel_data",
    "DataLoaderDispatcher": "accel_data",
    "BatchSamplerShard": "accel_data",
    "SeedableRandomSampler": "accel_data",
    "prepare_data_loader": "accel_data",
    "skip_first_batches": "accel_data",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
