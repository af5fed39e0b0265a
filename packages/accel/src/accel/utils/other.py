"""``accel.utils.other``: the names of ``accelerate.utils.other``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = (
    "check_os_kernel",
    "clean_state_dict_for_safetensors",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_model_tp_size",
    "get_module_children_bottom_up",
    "get_pretty_name",
    "has_compiled_regions",
    "is_compiled_module",
    "is_port_in_use",
    "load",
    "merge_dicts",
    "model_has_dtensor",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
)

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES)
