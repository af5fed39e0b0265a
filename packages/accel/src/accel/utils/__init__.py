"""``accel.utils``: the public utilities, gathered from the packages that own them (imported on first use)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

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
    # data
    "SeedableRandomSampler": "accel_data",
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
    "FP8RecipeKwargs": "accel_core.precision.fp8_recipes",
    "AORecipeKwargs": "accel_core.precision.fp8_recipes",
    "TERecipeKwargs": "accel_core.precision.fp8_recipes",
    "FP8BackendType": "accel_core.enums",
    # fp8 helpers (accel-fp8: pip install "accel[fp8]")
    "convert_model_to_fp8_ao": "accel_fp8.ao",
    "has_ao_layers": "accel_fp8.ao",
    "filter_first_and_last_linear_layers": "accel_fp8.report",
    "check_cuda_fp8_capability": "accel_fp8.factory",
    "convert_model": "accel_fp8.te",
    "has_transformer_engine_layers": "accel_fp8.te",
    "apply_fp8_autowrap": "accel_fp8.te",
    "contextual_fp8_autocast": "accel_fp8.te",
    "ProfileKwargs": "accel_core.configuration",
    "TorchDynamoPlugin": "accel_core.configuration",
    "DDPCommunicationHookType": "accel_core.enums",
    "GradientAccumulationPlugin": "accel_core.configuration",
    "DataLoaderConfiguration": "accel_core.configuration",
    "ProjectConfiguration": "accel_core.configuration",
    "ParallelismConfig": "accel_core.parallel.config",
    # backend plugins (extras: accel[fsdp], accel[deepspeed], accel[megatron])
    "FullyShardedDataParallelPlugin": "accel_fsdp",
    "DeepSpeedPlugin": "accel_deepspeed",
    "MegatronLMPlugin": "accel_megatron",
    "DummyOptim": "accel_deepspeed",
    "DummyScheduler": "accel_deepspeed",
    "MegatronLMDummyScheduler": "accel_megatron",
    # trackers
    "LoggerType": "accel_tracking",
    "GeneralTracker": "accel_tracking",
    # -- the reference's other accelerate.utils names (issue 18) --
    # nested structures (local) and the rest of the collectives
    "is_torch_tensor": "accel_core.ops",
    "is_namedtuple": "accel_core.ops",
    "honor_type": "accel_core.ops",
    "TensorInformation": "accel_core.structures",
    "is_tensor_information": "accel_core.structures",
    "get_data_structure": "accel_core.structures",
    "initialize_tensors": "accel_core.structures",
    "listify": "accel_core.structures",
    "ignorant_find_batch_size": "accel_core.structures",
    "find_device": "accel_core.structures",
    "convert_outputs_to_fp32": "accel_core.structures",
    # memory
    "find_executable_batch_size": "accel_core.compat.memory",
    "release_memory": "accel_core.compat.memory",
    # models
    "extract_model_from_parallel": "accel_core.model_utils",
    "is_compiled_module": "accel_core.model_utils",
    "has_compiled_regions": "accel_core.model_utils",
    "get_model_tp_size": "accel_core.model_utils",
    "model_has_dtensor": "accel_core.model_utils",
    "get_module_children_bottom_up": "accel_core.model_utils",
    "recursive_getattr": "accel_core.model_utils",
    "is_peft_model": "accel_core.model_utils",
    # processes and small helpers
    "wait_for_everyone": "accel_core.compat.reference_utils",
    "get_pretty_name": "accel_core.compat.reference_utils",
    "merge_dicts": "accel_core.compat.reference_utils",
    "is_port_in_use": "accel_core.compat.reference_utils",
    "convert_bytes": "accel_core.compat.reference_utils",
    "check_os_kernel": "accel_core.compat.reference_utils",
    # environment
    "patch_environment": "accel_core.compat.env_utils",
    "clear_environment": "accel_core.compat.env_utils",
    "purge_accelerate_environment": "accel_core.compat.env_utils",
    "str_to_bool": "accel_core.compat.env_utils",
    "parse_flag_from_env": "accel_core.compat.env_utils",
    "parse_choice_from_env": "accel_core.compat.env_utils",
    "get_int_from_env": "accel_core.compat.env_utils",
    "convert_dict_to_env_variables": "accel_core.compat.env_utils",
    "are_libraries_initialized": "accel_core.compat.env_utils",
    "get_current_device_type": "accel_core.compat.env_utils",
    # versions and constants
    "compare_versions": "accel_core.compat.versions",
    "is_torch_version": "accel_core.compat.versions",
    "TORCH_DISTRIBUTED_OPERATION_TYPES": "accel_core.constants",
    "TORCH_LAUNCH_PARAMS": "accel_core.constants",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION": "accel_core.constants",
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION": "accel_core.constants",
    "MODEL_NAME": "accel_checkpoint.file_names",
    "SAFE_MODEL_NAME": "accel_checkpoint.file_names",
    "WEIGHTS_NAME": "accel_checkpoint.file_names",
    "WEIGHTS_INDEX_NAME": "accel_checkpoint.file_names",
    "WEIGHTS_PATTERN_NAME": "accel_checkpoint.file_names",
    "SAFE_WEIGHTS_NAME": "accel_checkpoint.file_names",
    "SAFE_WEIGHTS_INDEX_NAME": "accel_checkpoint.file_names",
    "SAFE_WEIGHTS_PATTERN_NAME": "accel_checkpoint.file_names",
    "OPTIMIZER_NAME": "accel_checkpoint.file_names",
    "SCHEDULER_NAME": "accel_checkpoint.file_names",
    "SCALER_NAME": "accel_checkpoint.file_names",
    "SAMPLER_NAME": "accel_checkpoint.file_names",
    "RNG_STATE_NAME": "accel_checkpoint.file_names",
    "PROFILE_PATTERN_NAME": "accel_checkpoint.file_names",
    # files
    "save": "accel_checkpoint.user_io",
    "load": "accel_checkpoint.user_io",
    "clean_state_dict_for_safetensors": "accel_checkpoint.user_io",
    "id_tensor_storage": "accel_checkpoint.user_io",
    # big models (accel_checkpoint.big_modeling)
    "infer_auto_device_map": "accel_checkpoint.big_modeling",
    "load_checkpoint_in_model": "accel_checkpoint.big_modeling",
    "load_state_dict": "accel_checkpoint.big_modeling",
    "check_device_map": "accel_checkpoint.big_modeling",
    "compute_module_sizes": "accel_checkpoint.big_modeling",
    "calculate_maximum_sizes": "accel_checkpoint.big_modeling",
    "convert_file_size_to_int": "accel_checkpoint.big_modeling",
    "dtype_byte_size": "accel_checkpoint.big_modeling",
    "get_balanced_memory": "accel_checkpoint.big_modeling",
    "get_max_layer_size": "accel_checkpoint.big_modeling",
    "get_max_memory": "accel_checkpoint.big_modeling",
    "named_module_tensors": "accel_checkpoint.big_modeling",
    "find_tied_parameters": "accel_checkpoint.big_modeling",
    "retie_parameters": "accel_checkpoint.big_modeling",
    "check_tied_parameters_in_config": "accel_checkpoint.big_modeling",
    "check_tied_parameters_on_same_device": "accel_checkpoint.big_modeling",
    "set_module_tensor_to_device": "accel_checkpoint.big_modeling",
    "has_offloaded_params": "accel_checkpoint.big_modeling",
    "align_module_device": "accel_checkpoint.big_modeling",
    "merge_fsdp_weights": "accel_checkpoint.merge",
    "OffloadedWeightsLoader": "accel_checkpoint.big_modeling",
    "PrefixedDataset": "accel_checkpoint.big_modeling",
    "extract_submodules_state_dict": "accel_checkpoint.big_modeling",
    "offload_state_dict": "accel_checkpoint.big_modeling",
    "offload_weight": "accel_checkpoint.big_modeling",
    "save_offload_index": "accel_checkpoint.big_modeling",
    "load_offloaded_weights": "accel_checkpoint.big_modeling",
    "CustomDtype": "accel_checkpoint.big_modeling",
    # progress bar, config file
    "tqdm": "accel_tracking.progress",
    "write_basic_config": "accel.commands.config",
    # DeepSpeed wrappers (extra: accel[deepspeed])
    "DeepSpeedOptimizerWrapper": "accel_deepspeed",
    "DeepSpeedSchedulerWrapper": "accel_deepspeed",
    "HfDeepSpeedConfig": "accel_deepspeed",
    # FSDP model / optimizer files as transformers' Trainer writes them (extra: accel[fsdp])
    "save_fsdp_model": "accel_fsdp.trainer_files",
    "load_fsdp_model": "accel_fsdp.trainer_files",
    "save_fsdp_optimizer": "accel_fsdp.trainer_files",
    "load_fsdp_optimizer": "accel_fsdp.trainer_files",
}

# The `is_*_available` checks and the decorators that use them.
_EXPORTS.update(
    {
        name: "accel_core.compat.availability"
        for name in (
            "is_4bit_bnb_available", "is_8bit_bnb_available", "is_aim_available", "is_amdsmi_available",
            "is_bf16_available", "is_bitsandbytes_multi_backend_available", "is_bnb_available", "is_boto3_available",
            "is_clearml_available", "is_comet_ml_available", "is_cuda_available", "is_datasets_available",
            "is_deepspeed_available", "is_dvclive_available", "is_fp16_available", "is_fp8_available",
            "is_habana_gaudi1", "is_hpu_available", "is_import_timer_available", "is_lomo_available",
            "is_matplotlib_available", "is_megatron_lm_available", "is_mlflow_available", "is_mlu_available",
            "is_mps_available", "is_msamp_available", "is_musa_available", "is_neuron_available", "is_npu_available",
            "is_pandas_available", "is_peft_available", "is_pippy_available", "is_pynvml_available",
            "is_pytest_available", "is_rich_available", "is_rocm_available", "is_sagemaker_available",
            "is_schedulefree_available", "is_sdaa_available", "is_swanlab_available", "is_tensorboard_available",
            "is_timm_available", "is_torch_xla_available", "is_torchao_available", "is_torchdata_available",
            "is_torchdata_stateful_dataloader_available", "is_torchvision_available", "is_trackio_available",
            "is_transformer_engine_available", "is_transformer_engine_mxfp8_available", "is_transformers_available",
            "is_triton_available", "is_wandb_available", "is_weights_only_available", "is_xccl_available",
            "is_xpu_available",
        )
    }
)  # fmt: skip
_EXPORTS.update(
    {"deepspeed_required": "accel_core.compat.requirements", "torchao_required": "accel_core.compat.requirements"}
)

__all__ = sorted(_EXPORTS)

# The reference's submodules (`from accel.utils.operations import gather`): each re-exports its share of the names
# above, so `accel.utils.operations.gather is accel.utils.gather`.
_SUBMODULES = {
    name: f".{name}"
    for name in (
        "ao",
        "constants",
        "dataclasses",
        "deepspeed",
        "environment",
        "fsdp_utils",
        "imports",
        "megatron_lm",
        "memory",
        "modeling",
        "offload",
        "operations",
        "other",
        "random",
        "tqdm",
        "transformer_engine",
        "versions",
    )
}


def _submodule_exports(
    namespace: dict[str, Any], names: Iterable[str], own: dict[str, str] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the submodule whose ``globals()`` is ``namespace``: ``names`` of this module, and
    ``own``: names the reference defines in that submodule only (not in ``accelerate.utils``), name -> module."""
    return lazy_exports(namespace, {**{name: _EXPORTS[name] for name in names}, **(own or {})})


# `accel.utils.tqdm` is the function, as in the reference, also once the submodule of that name is imported: loaded
# here (before __getattr__ exists, which would answer the function), so that a later `import accel.utils.tqdm` does
# not rebind the package's attribute to the module.
from . import tqdm as _tqdm_module  # noqa: E402, F401 - needs _submodule_exports above; loaded for its side effect

del globals()["tqdm"]

__getattr__, __dir__ = lazy_exports(globals(), {**_SUBMODULES, **_EXPORTS})
