"""Decorators of the reference's ``accelerate.utils``: a function that needs torchao, or DeepSpeed as the strategy.

Kept apart from the ``availability`` probes because ``deepspeed_required`` asks the process state,
which the probes must not import.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from .availability import is_torchao_available


def torchao_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: calling ``func`` without torchao installed raises an ImportError naming the fix."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(f"{func.__name__} needs torchao (>= 0.6.1): pip install torchao")
        return func(*args, **kwargs)

    return wrapper


def deepspeed_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: calling ``func`` raises ValueError when an Accelerator exists and does not run DeepSpeed."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..enums import DistributedType
        from ..state import AcceleratorState

        made = AcceleratorState.has_accelerator_settings()
        if made and AcceleratorState().distributed_type != DistributedType.DEEPSPEED:
            raise ValueError(
                f"{func.__name__} needs DeepSpeed: create the Accelerator with a DeepSpeedPlugin "
                "(or `accel launch --strategy deepspeed`) before calling it."
            )
        return func(*args, **kwargs)

    return wrapper
