"""Records the settings variables `accelerate launch` gives its workers, for tests/compat/test_accelerate_launch_env.py.

Hugging Face Accelerate's launcher hands its settings to the workers as variables (ACCELERATE_MIXED_PRECISION,
ACCELERATE_USE_FSDP with FSDP_*, ...). This script builds them with Accelerate's own code (its launch parser, the
checks of `launch_command` and the launcher function it would call), without starting anything, for a few launch
lines, and writes the variables each line adds to tests/compat/accelerate_launch_env.json. Run it with Accelerate
installed next to the workspace's environment (no network needed for accel's tests afterwards):

    XDG_CONFIG_HOME=$(mktemp -d) HF_HOME=$(mktemp -d) \
        uv run --with accelerate==1.16.0 python tests/compat/capture_accelerate_launch_env.py

The empty XDG_CONFIG_HOME / HF_HOME keep a local `accelerate config` file out of the recording.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import accelerate
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import (
    prepare_deepspeed_cmd_env,
    prepare_multi_gpu_env,
    prepare_simple_launcher_cmd_env,
)

OUT = Path(__file__).resolve().parent / "accelerate_launch_env.json"
# The variables of Accelerate's settings protocol (torchrun's own, OMP_* and the like are not recorded).
SETTINGS = re.compile(r"^(ACCELERATE_|FSDP_|MEGATRON_LM_|PARALLELISM_CONFIG_)")

# name -> the launch line (after `accelerate launch`); the script is a placeholder, never run.
LINES = {
    "cpu_bf16_compile_debug": "--cpu --num_processes 2 --mixed_precision bf16 --dynamo_backend eager "
    "--dynamo_mode reduce-overhead --dynamo_use_dynamic --debug",
    "fsdp2_size_wrap": "--num_processes 2 --mixed_precision bf16 --use_fsdp --fsdp_version 2 "
    "--fsdp_auto_wrap_policy SIZE_BASED_WRAP --fsdp_min_num_params 1000 --fsdp_state_dict_type SHARDED_STATE_DICT "
    "--fsdp_reshard_after_forward true",
    "deepspeed_zero2_accumulation": "--use_deepspeed --num_processes 2 --zero_stage 2 --gradient_accumulation_steps 4 "
    "--gradient_clipping 1.0 --offload_optimizer_device none --mixed_precision no",
    "megatron_tp2": "--num_processes 2 --use_megatron_lm --megatron_lm_tp_degree 2 "
    "--megatron_lm_pp_degree 1 --megatron_lm_num_micro_batches 2 --megatron_lm_gradient_clipping 1.0",
    "megatron_recompute_granularity": "--num_processes 2 --use_megatron_lm --megatron_lm_tp_degree 2 "
    "--megatron_lm_recompute_granularity full",
    "fsdp_activation_checkpointing_offload": "--num_processes 2 --use_fsdp "
    "--fsdp_activation_checkpointing true --fsdp_activation_checkpointing_offload true",
}


def worker_variables(line: str) -> dict[str, str]:
    """The settings variables the workers of `accelerate launch <line> train.py` get, as Accelerate builds them."""
    args = launch_command_parser().parse_args([*line.split(), "train.py"])
    args, _, _ = _validate_launch_command(args)
    # The branch of accelerate's launch_command that this line takes.
    if args.use_deepspeed and not args.cpu:
        args.deepspeed_fields_from_accelerate_config = []  # as launch_command sets it without a config file
        _, environ = prepare_deepspeed_cmd_env(args)
    elif (args.use_fsdp or args.use_megatron_lm or args.multi_gpu) and not args.cpu:
        environ = prepare_multi_gpu_env(args)
    else:
        _, environ = prepare_simple_launcher_cmd_env(args)
    return {name: value for name, value in sorted(environ.items()) if SETTINGS.match(name) and name not in os.environ}


def main() -> None:
    record = {
        "accelerate": accelerate.__version__,
        "lines": {name: {"line": line, "variables": worker_variables(line)} for name, line in LINES.items()},
    }
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {OUT} ({len(LINES)} launch lines, Accelerate {accelerate.__version__})")


if __name__ == "__main__":
    main()
