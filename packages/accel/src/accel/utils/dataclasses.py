"""``accel.utils.dataclasses``: the names of ``accelerate.utils.dataclasses``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = (
    "AORecipeKwargs",
    "AutocastKwargs",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MegatronLMPlugin",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchDynamoPlugin",
)

# Defined in the reference's submodule only (not in `accelerate.utils`).
_OWN = {
    "get_module_class_from_name": "accel_core.model_utils",
}

__all__ = sorted(_NAMES) + sorted(_OWN)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES, _OWN)
