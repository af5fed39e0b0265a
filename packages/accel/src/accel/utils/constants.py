"""``accel.utils.constants``: the names of ``accelerate.utils.constants``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = (
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "TORCH_DISTRIBUTED_OPERATION_TYPES",
    "TORCH_LAUNCH_PARAMS",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
)

# Defined in the reference's submodule only (not in `accelerate.utils`).
_OWN = {
    "FSDP_AUTO_WRAP_POLICY": "accel_fsdp.constants",
    "FSDP_SHARDING_STRATEGY": "accel_fsdp.constants",
    "FSDP_BACKWARD_PREFETCH": "accel_fsdp.constants",
    "FSDP_STATE_DICT_TYPE": "accel_fsdp.constants",
}

__all__ = sorted(_NAMES) + sorted(_OWN)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES, _OWN)
