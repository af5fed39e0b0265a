"""``accel.big_modeling``: big-model loading under the reference's module name (see
``accel_checkpoint.big_modeling``). Imported on first use."""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    name: "accel_checkpoint.big_modeling"
    for name in (
        "check_device_map",
        "cpu_offload",
        "cpu_offload_with_hook",
        "disk_offload",
        "dispatch_model",
        "init_empty_weights",
        "init_on_device",
        "load_checkpoint_and_dispatch",
    )
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
