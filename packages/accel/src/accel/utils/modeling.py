"""``accel.utils.modeling``: the names of ``accelerate.utils.modeling``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = (
    "WEIGHTS_INDEX_NAME",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "compute_module_sizes",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "is_peft_model",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
)

# Defined in the reference's submodule only (not in `accelerate.utils`).
_OWN = {
    "clean_device_map": "accel_checkpoint.big_modeling",
    "get_state_dict_from_offload": "accel_checkpoint.big_modeling",
}

__all__ = sorted(_NAMES) + sorted(_OWN)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES, _OWN)
