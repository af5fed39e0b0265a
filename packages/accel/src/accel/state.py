"""``accel.state``: the state classes (``accelerate.state``) under the reference's module path."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "PartialState": "accel_core.state",
    "AcceleratorState": "accel_core.state",
    "GradientState": "accel_core.state",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
