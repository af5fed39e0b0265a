"""Strategies: how the processes train together. Core ships single-device and DDP; backend
packages register more under the ``accel.strategies`` entry-point group."""

from __future__ import annotations

from typing import Any

from ..discovery import load
from ..settings import RunSettings
from .base import (
    BackwardSyncControl,
    BatchTransfer,
    ReducesGradients,
    ShardedCheckpointing,
    Strategy,
)
from .context import JointResult, PreparedObjects, StrategyContext
from .ddp import DDPStrategy, SingleDeviceStrategy
from .selection import StrategyPlan, resolve_strategy_plan

_BUILTIN: dict[str, type[Strategy]] = {"ddp": DDPStrategy, "single_device": SingleDeviceStrategy}


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name`` (core's own, or an ``accel.strategies`` entry point)."""
    cls = _BUILTIN.get(name) or load("accel.strategies", name)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"The accel.strategies entry point {name!r} is {cls!r}, not a subclass of accel_core Strategy.")
    return cls


def create_strategy(
    name: str, plugin: Any = None, handlers: dict[type, Any] | None = None, settings: RunSettings | None = None
) -> Strategy:
    """Builds the strategy ``name`` with ``from_plugin(plugin, handlers, settings)`` (settings: the run's settled
    record; one of an empty environment when not given)."""
    return strategy_class(name).from_plugin(plugin, handlers or {}, settings if settings is not None else RunSettings())


__all__ = [
    "BackwardSyncControl",
    "BatchTransfer",
    "DDPStrategy",
    "JointResult",
    "PreparedObjects",
    "ReducesGradients",
    "ShardedCheckpointing",
    "SingleDeviceStrategy",
    "Strategy",
    "StrategyContext",
    "StrategyPlan",
    "create_strategy",
    "resolve_strategy_plan",
    "strategy_class",
]
