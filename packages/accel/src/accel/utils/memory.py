"""``accel.utils.memory``: the names of ``accelerate.utils.memory``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = ("find_executable_batch_size", "release_memory")

# Defined in the reference's submodule only (not in `accelerate.utils`).
_OWN = {
    "clear_device_cache": "accel_core.compat.memory",
    "should_reduce_batch_size": "accel_core.compat.memory",
}

__all__ = sorted(_NAMES) + sorted(_OWN)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES, _OWN)
