"""``accel.optimizer``: the prepared optimizer (``accelerate.optimizer``) under the reference's module path."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "AcceleratedOptimizer": "accel_core.optimizer",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
