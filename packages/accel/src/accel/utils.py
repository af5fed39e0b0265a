"""``accel.utils``: the public utilities, gathered from the packages that own them (imported on first use)."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    # collectives
    "gather": "accel_core.ops",
    "gather_object": "accel_core.ops",
    "reduce": "accel_core.ops",
    "broadcast": "accel_core.ops",
    "broadcast_object_list": "accel_core.ops",
    "pad_across_processes": "accel_core.ops",
    "send_to_device": "accel_core.ops",
    "recursively_apply": "accel_core.ops",
    "find_batch_size": "accel_core.ops",
    "concatenate": "accel_core.ops",
    "slice_tensors": "accel_core.ops",
    "convert_to_fp32": "accel_core.ops",
    "DistributedOperationException": "accel_core.ops",
    # randomness
    "set_seed": "accel_core.random",
    "synchronize_rng_state": "accel_core.random",
    "synchronize_rng_states": "accel_core.random",
    # configuration
    "DistributedType": "accel_core.enums",
    "PrecisionType": "accel_core.enums",
    "RNGType": "accel_core.enums",
    "DynamoBackend": "accel_core.enums",
    "KwargsHandler": "accel_core.configuration",
    "DistributedDataParallelKwargs": "accel_core.configuration",
    "GradScalerKwargs": "accel_core.configuration",
    "InitProcessGroupKwargs": "accel_core.configuration",
    "AutocastKwargs": "accel_core.configuration",
    "FP8RecipeKwargs": "accel_core.configuration",
    "GradientAccumulationPlugin": "accel_core.configuration",
    "DataLoaderConfiguration": "accel_core.configuration",
    "ProjectConfiguration": "accel_core.configuration",
    "ParallelismConfig": "accel_core.parallelism",
    # backend plugins (extras: accel[fsdp], accel[deepspeed], accel[megatron])
    "FullyShardedDataParallelPlugin": "accel_fsdp",
    "DeepSpeedPlugin": "accel_deepspeed",
    "MegatronLMPlugin": "accel_megatron",
    "DummyOptim": "accel_deepspeed",
    "DummyScheduler": "accel_deepspeed",
    # trackers
    "LoggerType": "accel_tracking",
    "GeneralTracker": "accel_tracking",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
