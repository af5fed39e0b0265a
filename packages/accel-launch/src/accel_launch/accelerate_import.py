"""Converts a Hugging Face Accelerate ``default_config.yaml`` into an accel config, saying what it drops.

Pure: a mapping in, ``(config, warnings)`` out. ``accel config import <file>`` reads and writes.

Example::

    config, warnings = convert_accelerate_config({"distributed_type": "MULTI_CPU", "num_processes": 2})
    assert config == {"num_processes": 2, "use_cpu": True}
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from accel_core import environment as env

# Keys that mean the same thing in both files.
_SAME = (
    "num_processes",
    "num_machines",
    "machine_rank",
    "main_process_ip",
    "main_process_port",
    "rdzv_backend",
    "mixed_precision",
    "use_cpu",
    "debug",
    "gradient_accumulation_steps",
    "max_restarts",
    "monitor_interval",
)

# distributed_type -> accel strategy (None: automatic, i.e. DDP with several processes).
_STRATEGY = {
    "NO": None,
    "MULTI_GPU": None,
    "MULTI_CPU": None,
    "MULTI_XPU": None,
    "MULTI_NPU": None,
    "MULTI_MLU": None,
    "MULTI_MUSA": None,
    "MULTI_HPU": None,
    "MULTI_SDAA": None,
    "FSDP": "fsdp",
    "DEEPSPEED": "deepspeed",
    "MEGATRON_LM": "megatron",
    "XLA": "xla",
    "TPU": "xla",
}

# Accelerate's backend sections -> accel section; the section's own prefix is dropped from its keys
# (fsdp_config.fsdp_sharding_strategy -> fsdp.sharding_strategy -> ACCEL_FSDP_SHARDING_STRATEGY).
_SECTIONS = {
    "fsdp_config": ("fsdp", "fsdp_"),
    "deepspeed_config": ("deepspeed", "deepspeed_"),
    "megatron_lm_config": ("megatron", "megatron_lm_"),
    "fp8_config": ("fp8", "fp8_"),
}

# Values that carry no information for accel: dropped without a warning.
_HARMLESS: dict[str, tuple[Any, ...]] = {
    "compute_environment": ("LOCAL_MACHINE",),
    "gpu_ids": ("all", None, ""),
    "same_network": (True, None),
    "main_training_function": ("main", None),
    "enable_cpu_affinity": (False, None),
    "downcast_bf16": ("no", False, None),
    "tpu_use_cluster": (False, None),
    "tpu_use_sudo": (False, None),
    "tpu_env": ([], None),
    "tpu_name": (None,),
    "tpu_zone": (None,),
    "tpu_vm": (None,),
    "command_file": (None,),
    "commands": (None,),
    "ipex_config": ({}, None),
    "mpirun_config": ({}, None),
}
_DYNAMO_HARMLESS: dict[str, tuple[Any, ...]] = {
    "dynamo_mode": ("default", None),
    "dynamo_use_fullgraph": (False, None),
    "dynamo_use_dynamic": (False, None),
    "dynamo_use_regional_compilation": (False, None),
}
# Accelerate's dynamo_config keys -> the variables TorchDynamoPlugin reads (accel_core.environment).
_DYNAMO_VARIABLES = {
    "dynamo_mode": env.DYNAMO_MODE,
    "dynamo_use_fullgraph": env.DYNAMO_USE_FULLGRAPH,
    "dynamo_use_dynamic": env.DYNAMO_USE_DYNAMIC,
    "dynamo_use_regional_compilation": env.DYNAMO_USE_REGIONAL_COMPILATION,
}


def convert_accelerate_config(
    data: Mapping[str, Any], section_options: Mapping[str, Collection[str]] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Returns the accel config equivalent to an Accelerate config, and one warning per key dropped.

    section_options: the options each backend section may hold (``extensions.declared_config_options``; ``None``:
    those of the installed backends). A backend option accel's strategy does not read is dropped with a warning,
    where ``accel launch`` would refuse the section.
    """
    if not isinstance(data, Mapping):
        raise ValueError("An Accelerate config is a YAML mapping (compute_environment, distributed_type, ...).")
    if section_options is None:
        from .extensions import declared_config_options, load_extensions

        section_options = declared_config_options(load_extensions())
    config: dict[str, Any] = {}
    warnings: list[str] = []
    section_steps = None
    for key, value in data.items():
        if key in _SAME:
            if value is not None:
                config[key] = value
        elif key == "distributed_type":
            name = str(value).upper()
            if name not in _STRATEGY:
                warnings.append(f"distributed_type: {value} has no accel equivalent; using the automatic choice.")
            elif _STRATEGY[name]:
                config["strategy"] = _STRATEGY[name]
            if name == "MULTI_CPU":
                config["use_cpu"] = True
        elif key in _SECTIONS:
            section, prefix = _SECTIONS[key]
            if value:
                written = {(k[len(prefix) :] if k.startswith(prefix) else k): k for k in dict(value)}
                options = {option: value[k] for option, k in written.items()}
                # Accelerate keeps DeepSpeed's accumulation steps in its section; accel has one
                # setting for every strategy, which the Accelerator reads.
                section_steps = options.pop("gradient_accumulation_steps", None) or section_steps
                known = section_options.get(section)
                for option in [option for option in options if known is not None and option not in known]:
                    if options.pop(option) not in (None, "", False, [], {}):
                        warnings.append(
                            f"{key}.{written[option]}: accel's {section} strategy has no such option; dropped."
                        )
                config[section] = options
        elif key == "parallelism_config":
            # Accelerate's keys are parallelism_config_<dim>_size; accel's settings are <dim>_size.
            for option, size in dict(value or {}).items():
                name = str(option).removeprefix("parallelism_config_")
                if name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "pp_size"):
                    if size is not None:
                        config[name] = size
                elif size not in (None, "", False):
                    warnings.append(f"parallelism_config.{option}: {size!r} has no accel equivalent and is dropped.")
        elif key == "dynamo_config":
            for dyn_key, dyn_value in dict(value or {}).items():
                if dyn_key == "dynamo_backend":
                    config["dynamo_backend"] = str(dyn_value).lower()
                elif dyn_key in _DYNAMO_VARIABLES:
                    if dyn_value not in _DYNAMO_HARMLESS[dyn_key]:
                        # TorchDynamoPlugin reads them in the workers (ACCEL_DYNAMO_MODE, ...).
                        value_text = str(dyn_value).lower() if isinstance(dyn_value, bool) else str(dyn_value)
                        config.setdefault("env", {})[_DYNAMO_VARIABLES[dyn_key]] = value_text
                elif dyn_value is not None:
                    warnings.append(f"dynamo_config.{dyn_key}: {dyn_value!r} has no accel equivalent and is dropped.")
        elif key == "gpu_ids" and value not in _HARMLESS["gpu_ids"]:
            # Accelerate restricts the visible GPUs; the workers' environment does the same here.
            config.setdefault("env", {})["CUDA_VISIBLE_DEVICES"] = str(value)
        elif key == "compute_environment" and value not in _HARMLESS[key]:
            warnings.append(f"compute_environment: {value} is not supported; the config is converted for this machine.")
        elif key in _HARMLESS and value in _HARMLESS[key]:
            continue
        else:
            warnings.append(f"{key}: {value!r} has no accel equivalent and is dropped.")
    if section_steps is not None and config.get("gradient_accumulation_steps") in (None, 1):
        config["gradient_accumulation_steps"] = section_steps
    return config, warnings
