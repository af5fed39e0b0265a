"""``accel launch`` flags of the fsdp strategy (the ``accel.cli`` entry point). No torch here.

Each flag becomes an ``ACCEL_FSDP_*`` variable that ``FullyShardedDataParallelPlugin.from_env``
reads in the launched processes; ``--use-fsdp`` (or any ``--fsdp-*`` flag) selects the strategy.

Example::

    accel launch --cpu -n 2 --use-fsdp --fsdp-auto-wrap-policy transformer_based_wrap \\
        --fsdp-transformer-layer-cls-to-wrap Block train.py
"""

from __future__ import annotations

from accel_core.launch_options import OptionTable, bool_text, choice_text, nonnegative_int_text

from .plugin import AUTO_WRAP_POLICIES, BACKWARD_PREFETCH, SHARDING_STRATEGIES, STATE_DICT_TYPES


def _bool_or_int_text(value: str) -> str:
    stripped = value.strip()
    if stripped.isdigit() and stripped not in ("0", "1"):
        return stripped
    return bool_text(value)


class FSDPLaunchOptions(OptionTable):
    """The fsdp strategy's ``accel launch`` flags (``accel_core.launch_options.OptionTable``)."""

    name = "fsdp"
    # (flag, ACCEL_FSDP_<OPTION>, parser, metavar, help)
    options = (
        (
            "fsdp-version",
            "VERSION",
            choice_text(("1", "2")),
            "{1,2}",
            "2: fully_shard (default); 1: FullyShardedDataParallel",
        ),
        (
            "fsdp-sharding-strategy",
            "SHARDING_STRATEGY",
            choice_text(SHARDING_STRATEGIES),
            "NAME",
            ", ".join(SHARDING_STRATEGIES),
        ),
        (
            "fsdp-reshard-after-forward",
            "RESHARD_AFTER_FORWARD",
            _bool_or_int_text,
            "BOOL",
            "FSDP2: free gathered parameters after forward",
        ),
        (
            "fsdp-offload-params",
            "OFFLOAD_PARAMS",
            bool_text,
            "BOOL",
            "keep sharded parameters and optimizer state in CPU memory",
        ),
        (
            "fsdp-auto-wrap-policy",
            "AUTO_WRAP_POLICY",
            choice_text(AUTO_WRAP_POLICIES),
            "NAME",
            ", ".join(AUTO_WRAP_POLICIES),
        ),
        (
            "fsdp-transformer-layer-cls-to-wrap",
            "TRANSFORMER_LAYER_CLS_TO_WRAP",
            str,
            "NAMES",
            "layer class names, comma-separated",
        ),
        (
            "fsdp-min-num-params",
            "MIN_NUM_PARAMS",
            nonnegative_int_text,
            "N",
            "SIZE_BASED_WRAP: parameters per unit at least",
        ),
        (
            "fsdp-backward-prefetch",
            "BACKWARD_PREFETCH",
            choice_text(BACKWARD_PREFETCH),
            "NAME",
            "FSDP1: " + ", ".join(BACKWARD_PREFETCH),
        ),
        ("fsdp-forward-prefetch", "FORWARD_PREFETCH", bool_text, "BOOL", "FSDP1: prefetch the next unit in forward"),
        (
            "fsdp-state-dict-type",
            "STATE_DICT_TYPE",
            choice_text(STATE_DICT_TYPES),
            "NAME",
            "what save_state writes: " + ", ".join(STATE_DICT_TYPES),
        ),
        (
            "fsdp-use-orig-params",
            "USE_ORIG_PARAMS",
            bool_text,
            "BOOL",
            "FSDP1: keep the original parameters (needed for param groups)",
        ),
        (
            "fsdp-sync-module-states",
            "SYNC_MODULE_STATES",
            bool_text,
            "BOOL",
            "start every process from process 0's weights",
        ),
        (
            "fsdp-cpu-ram-efficient-loading",
            "CPU_RAM_EFFICIENT_LOADING",
            bool_text,
            "BOOL",
            "only process 0 loads real weights",
        ),
        (
            "fsdp-activation-checkpointing",
            "ACTIVATION_CHECKPOINTING",
            bool_text,
            "BOOL",
            "recompute each unit's activations in backward",
        ),
        ("fsdp-limit-all-gathers", "LIMIT_ALL_GATHERS", bool_text, "BOOL", "FSDP1: rate-limit all-gathers"),
        (
            "fsdp-mixed-precision",
            "MIXED_PRECISION",
            str,
            "POLICY",
            'parameter dtype (bf16, fp16) or JSON {"param_dtype": ..., "reduce_dtype": ...}',
        ),
        ("fsdp-ignored-modules", "IGNORED_MODULES", str, "REGEX", "module names FSDP leaves alone"),
    )

    def config_options(self) -> tuple[str, ...]:
        """``DeclaresConfigOptions``: the ``fsdp:`` section's options, those ``FullyShardedDataParallelPlugin.from_env``
        reads."""
        from .plugin import ENV_OPTIONS

        return tuple(ENV_OPTIONS)
