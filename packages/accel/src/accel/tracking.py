"""``accel.tracking``: the trackers (``accelerate.tracking``) under the reference's module path."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "GeneralTracker": "accel_tracking",
    "TensorBoardTracker": "accel_tracking",
    "WandBTracker": "accel_tracking",
    "MLflowTracker": "accel_tracking",
    "CometMLTracker": "accel_tracking",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
