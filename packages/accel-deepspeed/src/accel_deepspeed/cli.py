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

from accel_core.launch_options import OptionTable, bool_text, nonnegative_number_text


def _stage_text(value: str) -> str:
    if value.strip() not in ("0", "1", "2", "3"):
        raise argparse.ArgumentTypeError(f"ZeRO stage is 0, 1, 2 or 3, got {value!r}")
    return value.strip()


def _device_text(value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in ("none", "cpu", "nvme"):
        raise argparse.ArgumentTypeError(f"expected none, cpu or nvme, got {value!r}")
    return lowered


class DeepSpeedLaunchOptions(OptionTable):
    """The deepspeed strategy's ``accel launch`` flags (``accel_core.launch_options.OptionTable``)."""

    name = "deepspeed"
    # (flag, ACCEL_DEEPSPEED_<OPTION>, parser, metavar, help)
    options = (
        (
            "deepspeed-config-file",
            "CONFIG_FILE",
            str,
            "PATH",
            'DeepSpeed JSON config; its "auto" values are filled by accel',
        ),
        ("zero-stage", "ZERO_STAGE", _stage_text, "{0,1,2,3}", "ZeRO stage (default 2 without a config file)"),
        (
            "gradient-clipping",
            "GRADIENT_CLIPPING",
            nonnegative_number_text,
            "NORM",
            "max gradient norm, applied inside DeepSpeed's step",
        ),
        (
            "offload-optimizer-device",
            "OFFLOAD_OPTIMIZER_DEVICE",
            _device_text,
            "{none,cpu,nvme}",
            "where optimizer states live",
        ),
        (
            "offload-param-device",
            "OFFLOAD_PARAM_DEVICE",
            _device_text,
            "{none,cpu,nvme}",
            "where parameters live (stage 3)",
        ),
        (
            "offload-optimizer-nvme-path",
            "OFFLOAD_OPTIMIZER_NVME_PATH",
            str,
            "PATH",
            "folder for --offload-optimizer-device nvme",
        ),
        ("offload-param-nvme-path", "OFFLOAD_PARAM_NVME_PATH", str, "PATH", "folder for --offload-param-device nvme"),
        (
            "zero3-init-flag",
            "ZERO3_INIT_FLAG",
            bool_text,
            "BOOL",
            "build models partitioned (strategy.zero3_init_context())",
        ),
        (
            "zero3-save-16bit-model",
            "ZERO3_SAVE_16BIT_MODEL",
            bool_text,
            "BOOL",
            "stage 3: gather full weights for save_model",
        ),
    )

    def config_options(self) -> tuple[str, ...]:
        """``DeclaresConfigOptions``: the ``deepspeed:`` section's options, those ``DeepSpeedPlugin.from_env`` reads
        and the launcher-only ones it skips (its module does not import torch or deepspeed)."""
        from .plugin import ENV_OPTIONS, LAUNCHER_ONLY_OPTIONS

        return (*ENV_OPTIONS, *LAUNCHER_ONLY_OPTIONS)
