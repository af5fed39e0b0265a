"""``accel.utils.dataclasses``: the names of ``accelerate.utils.dataclasses``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = (
    "AORecipeKwargs",
    "AutocastKwargs",
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

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES)
