"""``accel.big_modeling``: big-model loading under the reference's module name (see
``accel_checkpoint.big_modeling``)."""

from __future__ import annotations

from accel_checkpoint.big_modeling import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)

__all__ = [
    "cpu_offload",
    "disk_offload",
    "dispatch_model",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
]
