"""``accel.utils.ao``: the names of ``accelerate.utils.ao``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = ("convert_model_to_fp8_ao", "filter_first_and_last_linear_layers", "has_ao_layers")

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES)
