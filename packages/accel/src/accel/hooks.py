"""``accel.hooks``: Accelerate's ``ModelHook`` objects (``accelerate.hooks``) under the reference's module path.

``add_hook_to_module`` / ``remove_hook_from_module`` wrap a module's forward with a hook;
``AlignDevicesHook`` moves inputs and (offloaded) weights to the execution device, ``CpuOffload``
moves a whole model there when it runs. See ``accel_checkpoint.big_modeling.model_hooks``.
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

_EXPORTS = {
    name: "accel_checkpoint.big_modeling"
    for name in (
        "AlignDevicesHook",
        "CpuOffload",
        "ModelHook",
        "SequentialHook",
        "UserCpuOffloadHook",
        "add_hook_to_module",
        "attach_align_device_hook",
        "attach_align_device_hook_on_blocks",
        "attach_execution_device_hook",
        "remove_hook_from_module",
        "remove_hook_from_submodules",
    )
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
