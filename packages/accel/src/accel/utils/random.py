"""``accel.utils.random``: the names of ``accelerate.utils.random``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = ("set_seed", "synchronize_rng_state", "synchronize_rng_states")

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES)
