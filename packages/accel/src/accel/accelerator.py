"""``accel.accelerator``: Accelerator (``accelerate.accelerator``) under the reference's module path."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "Accelerator": "accel_core.accelerator",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
