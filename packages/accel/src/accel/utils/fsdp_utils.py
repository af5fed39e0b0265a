"""``accel.utils.fsdp_utils``: the names of ``accelerate.utils.fsdp_utils``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = (
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "merge_fsdp_weights",
    "save_fsdp_model",
    "save_fsdp_optimizer",
)

# Defined in the reference's submodule only (not in `accelerate.utils`).
_OWN = {
    "get_parameters_from_modules": "accel_fsdp.module_helpers",
}

__all__ = sorted(_NAMES) + sorted(_OWN)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES, _OWN)
