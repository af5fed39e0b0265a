"""``accel.utils.environment``: the names of ``accelerate.utils.environment``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = (
    "are_libraries_initialized",
    "check_cuda_fp8_capability",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_current_device_type",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
)

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES)
