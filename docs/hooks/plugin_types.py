"""griffe extension (mkdocstrings): the Accelerator's backend settings parameters shown with the classes they take.

accel-core's ``Accelerator`` annotates ``fsdp_plugin``, ``deepspeed_plugin(s)``, ``megatron_lm_plugin`` and
``log_with`` as ``Any``: their classes live in accel-fsdp, accel-deepspeed, accel-megatron and accel-tracking, which
accel-core must not import (the dependency rule of DESIGN.md, tests/packaging/test_boundaries.py), not even for
type checking. The API reference is read by users, who import these classes from ``accel.utils``; it shows them
there. tests/docs/test_reference_pages.py checks that each name below is one ``accel.utils`` exports.
"""

from __future__ import annotations

from typing import Any

import griffe

# The function whose parameters are rewritten, and each parameter's annotation as the reference shows it.
ANNOTATIONS: dict[str, dict[str, str]] = {
    "accel_core.accelerator.accelerator.Accelerator.__init__": {
        "deepspeed_plugin": "DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None",
        "fsdp_plugin": "FullyShardedDataParallelPlugin | None",
        "megatron_lm_plugin": "MegatronLMPlugin | None",
        "log_with": "str | LoggerType | GeneralTracker | list[str | LoggerType | GeneralTracker] | None",
        "deepspeed_plugins": "DeepSpeedPlugin | dict[str, DeepSpeedPlugin] | None",
    },
}


class PluginTypes(griffe.Extension):
    """Replaces the ``Any`` of the parameters in ``ANNOTATIONS`` (a parameter that is no longer ``Any`` is kept)."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for name, annotation in ANNOTATIONS.get(func.path, {}).items():
            if name in func.parameters and str(func.parameters[name].annotation) == "Any":
                func.parameters[name].annotation = annotation
