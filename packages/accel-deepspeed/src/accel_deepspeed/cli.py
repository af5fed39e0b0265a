"""``accel launch`` flags of the deepspeed strategy (the ``accel.cli`` entry point). No torch here.

Each flag becomes an ``ACCEL_DEEPSPEED_*`` variable that ``DeepSpeedPlugin.from_env`` reads in the
launched processes; ``--use-deepspeed`` (or any DeepSpeed flag) selects the strategy. Flags keep
Accelerate's names (``--zero_stage`` works as well as ``--zero-stage``). Processes are always
started by torchrun: DeepSpeed's own launcher flags (hostfile, multinode launcher) are not needed.

Example::

    accel launch --cpu -n 2 --use-deepspeed --zero-stage 3 --offload-optimizer-device cpu train.py
"""

from __future__ import annotations

import argparse
from typing import Any

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _bool_text(value: str) -> str:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return "true"
    if lowered in _FALSE:
        return "false"
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _stage_text(value: str) -> str:
    if value.strip() not in ("0", "1", "2", "3"):
        raise argparse.ArgumentTypeError(f"ZeRO stage is 0, 1, 2 or 3, got {value!r}")
    return value.strip()


def _device_text(value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in ("none", "cpu", "nvme"):
        raise argparse.ArgumentTypeError(f"expected none, cpu or nvme, got {value!r}")
    return lowered


def _number_text(value: str) -> str:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return value.strip()


# (flag without dashes, ACCEL_DEEPSPEED_<OPTION>, parser, metavar, help)
_OPTIONS: tuple[tuple[str, str, Any, str, str], ...] = (
    ("deepspeed_config_file", "CONFIG_FILE", str, "PATH", "DeepSpeed JSON config; its \"auto\" values are filled by accel"),
    ("zero_stage", "ZERO_STAGE", _stage_text, "{0,1,2,3}", "ZeRO stage (default 2 without a config file)"),
    ("gradient_clipping", "GRADIENT_CLIPPING", _number_text, "NORM", "max gradient norm, applied inside DeepSpeed's step"),
    ("offload_optimizer_device", "OFFLOAD_OPTIMIZER_DEVICE", _device_text, "{none,cpu,nvme}", "where optimizer states live"),
    ("offload_param_device", "OFFLOAD_PARAM_DEVICE", _device_text, "{none,cpu,nvme}", "where parameters live (stage 3)"),
    ("offload_optimizer_nvme_path", "OFFLOAD_OPTIMIZER_NVME_PATH", str, "PATH", "folder for --offload-optimizer-device nvme"),
    ("offload_param_nvme_path", "OFFLOAD_PARAM_NVME_PATH", str, "PATH", "folder for --offload-param-device nvme"),
    ("zero3_init_flag", "ZERO3_INIT_FLAG", _bool_text, "BOOL", "build models partitioned (strategy.zero3_init_context())"),
    ("zero3_save_16bit_model", "ZERO3_SAVE_16BIT_MODEL", _bool_text, "BOOL", "stage 3: gather full weights for save_model"),
)


class DeepSpeedLaunchOptions:
    """``LaunchExtension`` of the deepspeed strategy (see ``accel_core.launch.extensions``)."""

    name = "deepspeed"

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--use-deepspeed", "--use_deepspeed", dest="use_deepspeed", action="store_true", default=None,
            help="train with the deepspeed strategy (DeepSpeed ZeRO)",
        )
        for flag, _, parser, metavar, help_text in _OPTIONS:
            group.add_argument("--" + flag.replace("_", "-"), dest=f"deepspeed_{flag}", type=parser, default=None, metavar=metavar, help=help_text)
            group.add_argument("--" + flag, dest=f"deepspeed_{flag}", type=parser, default=None, help=argparse.SUPPRESS)

    def to_env(self, namespace: argparse.Namespace) -> dict[str, str]:
        result: dict[str, str] = {}
        for flag, option, _, _, _ in _OPTIONS:
            value = getattr(namespace, f"deepspeed_{flag}", None)
            if value is not None:
                result[f"ACCEL_DEEPSPEED_{option}"] = str(value)
        if getattr(namespace, "use_deepspeed", None) or result:
            result["ACCEL_STRATEGY"] = "deepspeed"
        return result
