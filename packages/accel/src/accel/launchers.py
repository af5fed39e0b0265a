"""``accel.launchers``: the in-process launchers (``accelerate.launchers``) under the reference's module path."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "notebook_launcher": "accel_launch",
    "debug_launcher": "accel_launch",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
