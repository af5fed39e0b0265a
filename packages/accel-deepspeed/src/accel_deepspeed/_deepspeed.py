"""Importing deepspeed once, without what accel never uses from it."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, cast

from accel_core.install_hints import accel_extra

if TYPE_CHECKING:
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator

_INSTALL_HINT = f"DeepSpeed is not installed: {accel_extra('deepspeed')} (or pip install accel-deepspeed deepspeed)."


def import_deepspeed() -> ModuleType:
    """``import deepspeed``, with a clear ImportError when it is missing.

    DeepSpeed's autotuner imports MLflow at import time when MLflow is installed (seconds of work on
    every process) only to log autotuning experiments, which accel does not run. MLflow is hidden
    from that one import; a later ``import mlflow`` by the user works as usual.
    """
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"]
    hide_mlflow = "mlflow" not in sys.modules
    if hide_mlflow:
        sys.modules["mlflow"] = None  # pyright: ignore[reportArgumentType]  # makes `import mlflow` raise ImportError
    try:
        import deepspeed
    except ImportError as error:
        if getattr(error, "name", None) == "deepspeed":
            raise ImportError(_INSTALL_HINT) from error
        raise
    finally:
        if hide_mlflow and sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]
    return deepspeed


def ds_accelerator() -> DeepSpeedAccelerator:
    """DeepSpeed's accelerator object (``deepspeed.accelerator.get_accelerator()``, untyped: inferred as optional)."""
    from deepspeed.accelerator import get_accelerator

    return cast("DeepSpeedAccelerator", get_accelerator())
