"""``accel.utils.transformer_engine``: the names of ``accelerate.utils.transformer_engine``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = ("apply_fp8_autowrap", "contextual_fp8_autocast", "convert_model", "has_transformer_engine_layers")

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES)
