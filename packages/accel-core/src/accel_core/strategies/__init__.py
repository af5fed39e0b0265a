"""Strategies: how the processes train together. Core ships single-device and DDP; backend
packages register more under the ``accel.strategies`` entry-point group."""

from __future__ import annotations

from typing import Any

from ..plugins import load
from .base import (
    BackwardSyncControl,
    BatchTransfer,
    JointPreparation,
    OwnsOptimizerStep,
    ProcessGroupSetup,
    Strategy,
    WrapsBeforeOptimizer,
)
from .ddp import DDPStrategy, SingleDeviceStrategy
from .selection import Plan, resolve_plan

_BUILTIN: dict[str, type[Strategy]] = {"ddp": DDPStrategy, "single_device": SingleDeviceStrategy}


def create_strategy(name: str, plugin: Any = None, handlers: dict[type, Any] | None = None) -> Strategy:
    """Builds the strategy ``name``; backend classes come from the ``accel.strategies`` entry points.

    A strategy class may define ``from_plugin(plugin, handlers)``; otherwise it is built with no arguments.
    """
    handlers = handlers or {}
    if name == "ddp":
        from ..configuration import DistributedDataParallelKwargs

        return DDPStrategy(handlers.get(DistributedDataParallelKwargs))
    cls = _BUILTIN.get(name) or load("accel.strategies", name)
    factory = getattr(cls, "from_plugin", None)
    return factory(plugin, handlers) if factory is not None else cls()


__all__ = [
    "BackwardSyncControl",
    "BatchTransfer",
    "DDPStrategy",
    "JointPreparation",
    "OwnsOptimizerStep",
    "Plan",
    "ProcessGroupSetup",
    "SingleDeviceStrategy",
    "Strategy",
    "WrapsBeforeOptimizer",
    "create_strategy",
    "resolve_plan",
]
