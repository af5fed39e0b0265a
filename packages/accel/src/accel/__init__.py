"""accel: run one plain PyTorch training script on one CPU, one GPU, many GPUs or many machines.

``from accel import Accelerator`` is the whole entry point. Names are imported on first use, so
``import accel`` (and the ``accel`` command line) does not import torch.
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Accelerator": "accel_core.accelerator",
    "PartialState": "accel_core.state",
    "AcceleratorState": "accel_core.state",
    "GradientState": "accel_core.state",
    "DistributedType": "accel_core.enums",
    "DataLoaderConfiguration": "accel_core.configuration",
    "ProjectConfiguration": "accel_core.configuration",
    "GradientAccumulationPlugin": "accel_core.configuration",
    "DistributedDataParallelKwargs": "accel_core.configuration",
    "GradScalerKwargs": "accel_core.configuration",
    "InitProcessGroupKwargs": "accel_core.configuration",
    "AutocastKwargs": "accel_core.configuration",
    "ProfileKwargs": "accel_core.configuration",
    "DDPCommunicationHookType": "accel_core.enums",
    "ParallelismConfig": "accel_core.parallel.config",
    "notebook_launcher": "accel_launch",
    "debug_launcher": "accel_launch",
    "skip_first_batches": "accel_data",
    "prepare_data_loader": "accel_data",
    # backend plugins (extras: accel[fsdp], accel[deepspeed], accel[megatron])
    "FullyShardedDataParallelPlugin": "accel_fsdp",
    "DeepSpeedPlugin": "accel_deepspeed",
    "MegatronLMPlugin": "accel_megatron",
    # the reference's other top-level names (issue 18)
    "find_executable_batch_size": "accel_core.compat.memory",
    "synchronize_rng_states": "accel_core.random",
    "is_rich_available": "accel_core.compat.availability",
    "init_empty_weights": "accel_checkpoint.big_modeling",
    "init_on_device": "accel_checkpoint.big_modeling",
    "infer_auto_device_map": "accel_checkpoint.big_modeling",
    "load_checkpoint_in_model": "accel_checkpoint.big_modeling",
    "load_checkpoint_and_dispatch": "accel_checkpoint.big_modeling",
    "dispatch_model": "accel_checkpoint.big_modeling",
    "cpu_offload": "accel_checkpoint.big_modeling",
    "cpu_offload_with_hook": "accel_checkpoint.big_modeling",
    "disk_offload": "accel_checkpoint.big_modeling",
}

# submodules, as in the reference: `from accel.logging import get_logger`, `accel.local_sgd.LocalSGD`,
# `from accel.state import PartialState`
_SUBMODULES = {
    name: f".{name}"
    for name in (
        "utils", "logging", "local_sgd", "big_modeling", "accelerator", "state", "data_loader", "optimizer",
        "scheduler", "parallelism_config", "launchers", "memory_utils", "tracking", "hooks",
    )
}  # fmt: skip

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)


__getattr__, __dir__ = lazy_exports(globals(), {**_EXPORTS, **_SUBMODULES})
