"""``accel.memory_utils``: ``find_executable_batch_size`` (``accelerate.memory_utils``)."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "find_executable_batch_size": "accel_core.compat.memory",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
