"""Checkpoints in the reference implementation's layout (no accel metadata): count what they hold."""

from __future__ import annotations

import os
import re

from . import constants as C


def _count(folder: str, pattern: str) -> int:
    regex = re.compile(pattern)
    return sum(1 for name in os.listdir(folder) if regex.fullmatch(name))


def legacy_counts(folder: str) -> dict[str, int | bool]:
    return {
        "models": _count(folder, rf"({C.MODEL_NAME}(_\d+)?\.safetensors|{C.PICKLE_MODEL_NAME}(_\d+)?\.bin)"),
        "optimizers": _count(folder, rf"{C.OPTIMIZER_NAME}(_\d+)?\.bin"),
        "schedulers": _count(folder, rf"{C.SCHEDULER_NAME}(_\d+)?\.bin"),
        "dataloaders": 0,
        "custom_objects": _count(folder, rf"{C.CUSTOM_NAME}_\d+\.pkl"),
        "scaler": os.path.isfile(os.path.join(folder, C.SCALER_NAME)),
    }
