"""``accel launch`` flags of the fsdp strategy (the ``accel.cli`` entry point). No torch here.

Each flag becomes an ``ACCEL_FSDP_*`` variable that ``FullyShardedDataParallelPlugin.from_env``
reads in the launched processes; ``--use-fsdp`` (or any ``--fsdp-*`` flag) selects the strategy.

Example::

    accel launch --cpu -n 2 --use-fsdp --fsdp-auto-wrap-policy transformer_based_wrap \\
        --fsdp-transformer-layer-cls-to-wrap Block train.py
"""

from __future__ import annotations

import argparse
from typing import Any

from .plugin import AUTO_WRAP_POLICIES, BACKWARD_PREFETCH, SHARDING_STRATEGIES, STATE_DICT_TYPES

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _bool_text(value: str) -> str:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return "true"
    if lowered in _FALSE:
        return "false"
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _bool_or_int_text(value: str) -> str:
    stripped = value.strip()
    if stripped.isdigit() and stripped not in ("0", "1"):
        return stripped
    return _bool_text(value)


def _choice_text(choices: tuple[str, ...]) -> Any:
    def parse(value: str) -> str:
        name = value.strip().upper()
        if name.isdigit() and 1 <= int(name) <= len(choices):
            return choices[int(name) - 1]
        if name not in choices:
            raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(choices)}")
        return name

    return parse


def _int_text(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if not number.is_integer() or number < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value!r}")
    return str(int(number))


# (flag, ACCEL_FSDP_<OPTION>, parser, metavar, help)
_OPTIONS: tuple[tuple[str, str, Any, str, str], ...] = (
    ("--fsdp-version", "VERSION", _choice_text(("1", "2")), "{1,2}", "2: fully_shard (default); 1: FullyShardedDataParallel"),
    ("--fsdp-sharding-strategy", "SHARDING_STRATEGY", _choice_text(SHARDING_STRATEGIES), "NAME", ", ".join(SHARDING_STRATEGIES)),
    ("--fsdp-reshard-after-forward", "RESHARD_AFTER_FORWARD", _bool_or_int_text, "BOOL", "FSDP2: free gathered parameters after forward"),
    ("--fsdp-offload-params", "OFFLOAD_PARAMS", _bool_text, "BOOL", "keep sharded parameters and optimizer state in CPU memory"),
    ("--fsdp-auto-wrap-policy", "AUTO_WRAP_POLICY", _choice_text(AUTO_WRAP_POLICIES), "NAME", ", ".join(AUTO_WRAP_POLICIES)),
    ("--fsdp-transformer-layer-cls-to-wrap", "TRANSFORMER_LAYER_CLS_TO_WRAP", str, "NAMES", "layer class names, comma-separated"),
    ("--fsdp-min-num-params", "MIN_NUM_PARAMS", _int_text, "N", "SIZE_BASED_WRAP: parameters per unit at least"),
    ("--fsdp-backward-prefetch", "BACKWARD_PREFETCH", _choice_text(BACKWARD_PREFETCH), "NAME", "FSDP1: " + ", ".join(BACKWARD_PREFETCH)),
    ("--fsdp-forward-prefetch", "FORWARD_PREFETCH", _bool_text, "BOOL", "FSDP1: prefetch the next unit in forward"),
    ("--fsdp-state-dict-type", "STATE_DICT_TYPE", _choice_text(STATE_DICT_TYPES), "NAME", "what save_state writes: " + ", ".join(STATE_DICT_TYPES)),
    ("--fsdp-use-orig-params", "USE_ORIG_PARAMS", _bool_text, "BOOL", "FSDP1: keep the original parameters (needed for param groups)"),
    ("--fsdp-sync-module-states", "SYNC_MODULE_STATES", _bool_text, "BOOL", "start every process from process 0's weights"),
    ("--fsdp-cpu-ram-efficient-loading", "CPU_RAM_EFFICIENT_LOADING", _bool_text, "BOOL", "only process 0 loads real weights"),
    ("--fsdp-activation-checkpointing", "ACTIVATION_CHECKPOINTING", _bool_text, "BOOL", "recompute each unit's activations in backward"),
    ("--fsdp-limit-all-gathers", "LIMIT_ALL_GATHERS", _bool_text, "BOOL", "FSDP1: rate-limit all-gathers"),
    ("--fsdp-mixed-precision", "MIXED_PRECISION", str, "POLICY", 'parameter dtype (bf16, fp16) or JSON {"param_dtype": ..., "reduce_dtype": ...}'),
    ("--fsdp-ignored-modules", "IGNORED_MODULES", str, "REGEX", "module names FSDP leaves alone"),
)


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


class FSDPLaunchOptions:
    """Implements ``accel_core.launch.extensions.LaunchExtension`` for the fsdp strategy."""

    name = "fsdp"

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--use-fsdp", dest="use_fsdp", action="store_true", default=None, help="train with the fsdp strategy")
        for flag, _, parse, metavar, text in _OPTIONS:
            group.add_argument(flag, dest=_dest(flag), type=parse, default=None, metavar=metavar, help=text)

    def to_env(self, namespace: argparse.Namespace) -> dict[str, str]:
        result: dict[str, str] = {}
        for flag, option, _, _, _ in _OPTIONS:
            value = getattr(namespace, _dest(flag), None)
            if value is not None:
                result[f"ACCEL_FSDP_{option}"] = str(value)
        if getattr(namespace, "use_fsdp", None) or result:
            result["ACCEL_STRATEGY"] = "fsdp"  # an FSDP option only makes sense with the strategy
        return result
