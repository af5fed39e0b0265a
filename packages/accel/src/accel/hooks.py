"""``accel.hooks``: big-model hook removal (``accelerate.hooks``) under the reference's module path."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    "remove_hook_from_submodules": "accel_checkpoint.big_modeling.hooks",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
