"""accel-core: process state, collectives, precision, the Strategy protocol, DDP and the Accelerator.

Names are imported on first use, so ``import accel_core`` does not import torch.
"""

from __future__ import annotations

from .lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Accelerator": ".accelerator",
    "PartialState": ".state",
    "AcceleratorState": ".state",
    "GradientState": ".state",
    "DistributedType": ".enums",
    "PrecisionType": ".enums",
    "RNGType": ".enums",
    "DynamoBackend": ".enums",
    "AcceleratedOptimizer": ".optimizer",
    "AcceleratedScheduler": ".scheduler",
    "DataLoaderConfiguration": ".configuration",
    "ProjectConfiguration": ".configuration",
    "GradientAccumulationPlugin": ".configuration",
    "KwargsHandler": ".configuration",
    "DistributedDataParallelKwargs": ".configuration",
    "GradScalerKwargs": ".configuration",
    "InitProcessGroupKwargs": ".configuration",
    "AutocastKwargs": ".configuration",
    "FP8RecipeKwargs": ".precision.fp8_recipes",
    "AORecipeKwargs": ".precision.fp8_recipes",
    "TERecipeKwargs": ".precision.fp8_recipes",
    "FP8BackendType": ".enums",
    "ProfileKwargs": ".configuration",
    "TorchDynamoPlugin": ".configuration",
    "DDPCommunicationHookType": ".enums",
    "SchedulerStepping": ".enums",
    "ParallelismConfig": ".parallel.config",
    "Strategy": ".strategies",
    "DistributedOperationException": ".ops",
    "set_seed": ".random",
    "synchronize_rng_states": ".random",
    "MissingPackageError": ".discovery",
    "MissingPluginError": ".discovery",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
