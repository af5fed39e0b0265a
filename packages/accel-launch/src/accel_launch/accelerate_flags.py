"""Hugging Face Accelerate's ``accelerate launch`` flags that ``accel launch`` spells differently or does not need.

Users bring their launch lines with them (``accelerate launch --multi_gpu --num_processes 8 train.py``). Most of
Accelerate's flags are accel's own under their underscored spelling (``--num_processes``, ``--use_fsdp``,
``--zero_stage``, ...). The rest are here, each with what ``accel launch`` does with it:

- translated: it becomes the variables that give the workers the same behaviour (``--num_cpu_threads_per_process``
  sets ``OMP_NUM_THREADS``, ``--gpu_ids`` ``CUDA_VISIBLE_DEVICES``, ``--fp8_*`` the fp8 recipe's ``ACCEL_FP8_*``);
- not needed: accel does the same without it (``--multi_gpu``: several processes are a data-parallel job anyway),
  or it only tunes what accel does not do; the launch goes on and says once that the flag can go;
- refused: accel cannot do what it asks (``--mpirun_hostfile``, ``--tpu``); the launch stops before starting
  anything, saying what to do instead. Such a flag given with Accelerate's default value asks for nothing: it is
  accepted as not needed.

Pure and without torch: ``add_accelerate_flags`` adds the hidden flags to a parser, ``accelerate_flags_env`` reads
them back from the parsed namespace.

Example::

    parser = argparse.ArgumentParser()
    add_accelerate_flags(parser)
    env, notes = accelerate_flags_env(parser.parse_args(["--multi_gpu", "--num_cpu_threads_per_process", "4"]))
    assert env == {"OMP_NUM_THREADS": "4"} and notes[0].startswith("--multi_gpu")
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from accel_core import environment as env
from accel_core.discovery import install_hint
from accel_core.launch_options import bool_text

from .hidden_flags import NOT_NEEDED, REFUSED, add_hidden_flag

_DEST_PREFIX = "accelerate_flag__"

TRANSLATED = "translated"


class RefusedFlagError(ValueError):
    """An Accelerate flag asks for something ``accel launch`` cannot do; the message says what to do instead."""


@dataclass(frozen=True)
class AccelerateFlag:
    """One of Accelerate's launch flags that accel has not under the same name.

    flag: Accelerate's spelling, ``--name`` (and its short form, if any, in ``short``).
    outcome: ``TRANSLATED``, ``NOT_NEEDED`` or ``REFUSED``.
    why: for NOT_NEEDED and REFUSED, the sentence the user reads (what accel does instead).
    takes_value: False for Accelerate's switches (``store_true``).
    to_env: for TRANSLATED, the given value (``"true"`` for a switch) to the workers' variables.
    harmless: values that ask for nothing (Accelerate's defaults): a REFUSED flag given one of them is not refused.
    """

    flag: str
    outcome: str
    why: str = ""
    takes_value: bool = True
    to_env: Callable[[str], dict[str, str]] | None = None
    harmless: tuple[str, ...] = ()
    short: str | None = None

    @property
    def dest(self) -> str:
        return _DEST_PREFIX + self.flag.removeprefix("--")


def _variable(name: str, transform: Callable[[str], str] = str.strip) -> Callable[[str], dict[str, str]]:
    return lambda value: {name: transform(value)}


def _override_linear_precision(value: str) -> dict[str, str]:
    """Accelerate's ``--fp8_override_linear_precision false,false,true``: (fprop, dgrad, wgrad)."""
    parts = value.split(",")
    try:
        if len(parts) != 3:
            raise argparse.ArgumentTypeError(f"{len(parts)} values")
        booleans = [bool_text(part) for part in parts]
    except argparse.ArgumentTypeError:
        raise RefusedFlagError(
            f"--fp8_override_linear_precision {value!r}: expected three booleans for the fprop, dgrad and wgrad "
            "GEMMs, e.g. false,false,true."
        ) from None
    return {f"ACCEL_FP8_OVERRIDE_{gemm}": b for gemm, b in zip(("FPROP", "DGRAD", "WGRAD"), booleans, strict=True)}


def _not_needed(flag: str, why: str, takes_value: bool = False, short: str | None = None) -> AccelerateFlag:
    return AccelerateFlag(flag, NOT_NEEDED, why, takes_value=takes_value, short=short)


def _refused(flag: str, why: str, harmless: tuple[str, ...] = (), takes_value: bool = True) -> AccelerateFlag:
    return AccelerateFlag(flag, REFUSED, why, takes_value=takes_value, harmless=harmless)


def _translated(flag: str, to_env: Callable[[str], dict[str, str]], takes_value: bool = True) -> AccelerateFlag:
    return AccelerateFlag(flag, TRANSLATED, takes_value=takes_value, to_env=to_env)


_TPU = "accel runs XLA / TPU jobs with --use-xla on the TPU VM itself (see accel-xla's README); it does not reach pods"
_MPI = (
    "accel launch starts processes with torchrun's agent, not mpirun; start the job with mpirun (or srun) yourself, "
    "where a plain Accelerator() joins it, or use --num-machines with --main-process-ip"
)
_MEGATRON = "accel-megatron has no such setting (its flags: accel launch --help, megatron options)"
_NO_BOOL = ("false", "False", "0", "no")

# The launch flags of Accelerate 1.15 and 1.16 that accel launch has not under the same name (tests/cli checks the whole
# list). 1.16's flags are 1.15's less --fp8_opt_level (MS-AMP's, dropped in 1.16): a 1.15 launch line keeps working.
ACCELERATE_FLAGS: tuple[AccelerateFlag, ...] = (
    # Not needed: accel does the same by itself, or the flag only tunes something accel leaves alone.
    _not_needed("--multi_gpu", "several processes are a data-parallel (DDP) job without it"),
    _not_needed("--same_network", "torchrun's rendezvous finds the machines without it"),
    _not_needed("--main_training_function", "it only names a notebook's function for TPU pods", takes_value=True),
    _not_needed("--use_parallelism_config", "the mesh follows the --*-size flags without it"),
    _not_needed(
        "--quiet",
        "accel launch reports a failure by the failing rank's own error, without the launcher's traceback",
        short="-q",
    ),
    _not_needed("--enable_cpu_affinity", "accel does not pin processes to NUMA nodes; the job runs unpinned"),
    _not_needed("--downcast_bf16", "it only changes bf16 on TPUs"),
    _not_needed("--no_tpu_cluster", "accel does not start TPU pods"),
    _not_needed("--role", "torchrun's worker role only labels its logs", takes_value=True),
    _not_needed("--parallelism_config_cp_backend", "accel's context parallelism is torch's", takes_value=True),
    _not_needed(
        "--fp8_opt_level",
        "it only tunes MS-AMP, which accel does not run (Accelerate 1.16 dropped the flag too)",
        takes_value=True,
    ),
    # Translated into the variables the workers read.
    _translated("--num_cpu_threads_per_process", _variable("OMP_NUM_THREADS")),
    _translated("--gpu_ids", _variable("CUDA_VISIBLE_DEVICES")),
    _translated("--dynamo_mode", _variable(env.DYNAMO_MODE)),
    _translated("--dynamo_use_fullgraph", _variable(env.DYNAMO_USE_FULLGRAPH), takes_value=False),
    _translated("--dynamo_use_dynamic", _variable(env.DYNAMO_USE_DYNAMIC), takes_value=False),
    _translated("--dynamo_use_regional_compilation", _variable(env.DYNAMO_USE_REGIONAL_COMPILATION), takes_value=False),
    _translated("--fp8_backend", _variable("ACCEL_FP8_BACKEND", lambda value: value.strip().upper())),
    _translated("--fp8_format", _variable("ACCEL_FP8_FORMAT", lambda value: value.strip().upper())),
    _translated("--fp8_margin", _variable("ACCEL_FP8_MARGIN")),
    _translated("--fp8_interval", _variable("ACCEL_FP8_INTERVAL")),
    _translated("--fp8_amax_history_len", _variable("ACCEL_FP8_AMAX_HISTORY_LEN")),
    _translated("--fp8_amax_compute_algo", _variable("ACCEL_FP8_AMAX_COMPUTE_ALGO")),
    _translated("--fp8_override_linear_precision", _override_linear_precision),
    _translated("--fp8_use_autocast_during_eval", _variable("ACCEL_FP8_USE_AUTOCAST_DURING_EVAL"), takes_value=False),
    _translated("--fp8_enable_fsdp_float8_all_gather", _variable("ACCEL_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER")),
    _translated("--fp8_pad_inner_dim", _variable("ACCEL_FP8_PAD_INNER_DIM")),
    # Refused: accel cannot do what they ask.
    # accel-xla's own --tpu (and --downcast-bf16) take over where it is installed.
    _refused("--tpu", "XLA / TPU jobs need accel-xla: pip install 'accel[xla]==0.1.0'", takes_value=False),
    _refused("--tpu_cluster", _TPU, takes_value=False),
    _refused("--tpu_use_sudo", _TPU, takes_value=False),
    _refused("--vm", _TPU),
    _refused("--aws_access_key_id", "accel does not launch SageMaker jobs"),
    _refused("--aws_secret_access_key", "accel does not launch SageMaker jobs"),
    _refused("--mpirun_hostfile", _MPI),
    _refused("--deepspeed_hostfile", _MPI),
    _refused("--deepspeed_multinode_launcher", _MPI),
    _refused("--deepspeed_inclusion_filter", _MPI),
    _refused("--deepspeed_exclusion_filter", _MPI),
    _refused(
        "--deepspeed_moe_layer_cls_names", "accel-deepspeed does not set up DeepSpeed's mixture-of-experts layers"
    ),
    _refused(
        "--no_python",
        "accel launch runs a Python script or module (-m); run another program with torchrun itself",
        takes_value=False,
    ),
    _refused("--parallelism_config_cp_comm_strategy", "accel's context parallelism all-gathers", ("allgather",)),
    _refused("--parallelism_config_sp_size", "accel has no DeepSpeed sequence parallelism (Ulysses)", ("1",)),
    _refused(
        "--parallelism_config_sp_backend", "accel has no DeepSpeed sequence parallelism (Ulysses)", ("deepspeed",)
    ),
    _refused("--parallelism_config_sp_seq_length", "accel has no DeepSpeed sequence parallelism (Ulysses)"),
    _refused(
        "--parallelism_config_sp_seq_length_is_variable",
        "accel has no DeepSpeed sequence parallelism (Ulysses)",
        ("true", "True", "1"),
    ),
    _refused(
        "--parallelism_config_sp_attn_implementation",
        "accel has no DeepSpeed sequence parallelism (Ulysses)",
        ("sdpa",),
    ),
    _refused(
        "--fsdp_activation_checkpointing_offload",
        "accel-fsdp recomputes activations (--fsdp-activation-checkpointing) but does not offload them to the CPU",
        _NO_BOOL,
    ),
    _refused("--megatron_lm_use_custom_fsdp", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_no_load_optim", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_no_save_optim", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_eod_mask_loss", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_overlap_cpu_optimizer_d2h_h2d", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_optimizer_cpu_offload", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_use_precision_aware_optimizer", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_decoder_last_pipeline_num_layers", _MEGATRON),
    _refused("--megatron_lm_recompute_activations", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_use_distributed_optimizer", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_recompute_granularity", _MEGATRON),
    _refused("--megatron_lm_recompute_method", _MEGATRON),
    _refused("--megatron_lm_recompute_num_layers", _MEGATRON),
    _refused("--megatron_lm_attention_backend", _MEGATRON),
    _refused("--megatron_lm_expert_model_parallel_size", _MEGATRON, ("1",)),
    _refused("--megatron_lm_expert_tensor_parallel_size", _MEGATRON, ("1",)),
    _refused("--megatron_lm_context_parallel_size", _MEGATRON, ("1",)),
    _refused("--megatron_lm_attention_dropout", _MEGATRON),
    _refused("--megatron_lm_hidden_dropout", _MEGATRON),
    _refused("--megatron_lm_attention_softmax_in_fp32", _MEGATRON),
    _refused("--megatron_lm_calculate_per_token_loss", _MEGATRON, _NO_BOOL),
    _refused("--megatron_lm_use_rotary_position_embeddings", _MEGATRON, _NO_BOOL),
)


# Accelerate's flags that a backend package gives `accel launch` under Accelerate's names (its strategy's options).
# Where that package is not installed (`accel` alone), each still parses and stops the launch naming the package to
# install, instead of argparse's bare "unrecognized arguments". The switches are the `--use_*` ones.
BACKEND_FLAGS: dict[str, tuple[str, ...]] = {
    "fsdp": (
        "--use_fsdp", "--fsdp_activation_checkpointing", "--fsdp_auto_wrap_policy", "--fsdp_backward_prefetch",
        "--fsdp_cpu_ram_efficient_loading", "--fsdp_forward_prefetch", "--fsdp_min_num_params",
        "--fsdp_offload_params", "--fsdp_reshard_after_forward", "--fsdp_sharding_strategy", "--fsdp_state_dict_type",
        "--fsdp_sync_module_states", "--fsdp_transformer_layer_cls_to_wrap", "--fsdp_use_orig_params",
        "--fsdp_version",
    ),
    "deepspeed": (
        "--use_deepspeed", "--deepspeed_config_file", "--zero_stage", "--zero3_init_flag", "--zero3_save_16bit_model",
        "--offload_optimizer_device", "--offload_optimizer_nvme_path", "--offload_param_device",
        "--offload_param_nvme_path", "--gradient_clipping",
    ),
    "megatron": (
        "--use_megatron_lm", "--megatron_lm_tp_degree", "--megatron_lm_pp_degree", "--megatron_lm_num_micro_batches",
        "--megatron_lm_sequence_parallelism", "--megatron_lm_gradient_clipping",
    ),
}  # fmt: skip
_MISSING_PREFIX = "accelerate_backend_flag__"


def _missing_dest(backend: str, flag: str) -> str:
    return f"{_MISSING_PREFIX}{backend}__{flag.removeprefix('--')}"


def add_accelerate_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the flags of ``ACCELERATE_FLAGS`` that ``parser`` does not have yet, hidden from ``--help``, and the
    ``BACKEND_FLAGS`` of backends whose package did not add them (not installed)."""
    for entry in ACCELERATE_FLAGS:
        names = [name for name in (entry.flag, entry.short) if name is not None]
        add_hidden_flag(parser, names, entry.dest, entry.takes_value)
    for backend, flags in BACKEND_FLAGS.items():
        for flag in flags:
            add_hidden_flag(parser, [flag], _missing_dest(backend, flag), takes_value=not flag.startswith("--use_"))


def _missing_backends(namespace: argparse.Namespace) -> list[str]:
    """One line per backend whose flags were given without its package: the flags and the install command."""
    lines = []
    for backend, flags in BACKEND_FLAGS.items():
        given = [flag for flag in flags if getattr(namespace, _missing_dest(backend, flag), None) is not None]
        if given:
            hint = install_hint("accel.strategies", backend)
            lines.append(f"{', '.join(given)}: the {backend} strategy's, whose package is not installed: {hint}.")
    return lines


def accelerate_flags_env(namespace: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """The workers' variables from the Accelerate flags given, and one note per flag that is not needed.

    Raises ``RefusedFlagError`` naming every refused flag given, with what to do instead."""
    variables: dict[str, str] = {}
    notes: list[str] = []
    refused: list[str] = []
    for entry in ACCELERATE_FLAGS:
        value = getattr(namespace, entry.dest, None)
        if value is None:
            continue
        shown = entry.flag if not entry.takes_value else f"{entry.flag} {value}"
        if entry.outcome == TRANSLATED and entry.to_env is not None:
            variables.update(entry.to_env(value))
        elif entry.outcome == NOT_NEEDED:
            notes.append(f"{shown}: Accelerate's flag, not needed: {entry.why}.")
        elif value in entry.harmless:
            notes.append(f"{shown}: Accelerate's flag with its default value, which asks for nothing: not needed.")
        else:
            refused.append(f"{shown}: {entry.why}.")
    if refused:
        raise RefusedFlagError("Accelerate's flag(s) that accel launch cannot honour:\n  " + "\n  ".join(refused))
    missing = _missing_backends(namespace)
    if missing:
        raise RefusedFlagError("Accelerate's flag(s) of a backend that is not installed:\n  " + "\n  ".join(missing))
    return variables, notes
