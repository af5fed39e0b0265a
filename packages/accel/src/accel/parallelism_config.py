"""``accel.parallelism_config``: ``ParallelismConfig`` (``accelerate.parallelism_config``)."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "ParallelismConfig": "accel_core.parallel.config",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
