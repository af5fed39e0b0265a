"""The old path of the backend flag contract, kept for backends written against it: import from
``accel_core.launch_options`` (the launcher's loading of the entry points is ``accel_launch.extensions``)."""

from __future__ import annotations

from ..launch_options import (
    GROUP,
    LaunchExtension,
    LaysMeshOverDevices,
    OptionTable,
    bool_text,
    choice_text,
    nonnegative_int_text,
    nonnegative_number_text,
)

__all__ = [
    "GROUP",
    "LaunchExtension",
    "LaysMeshOverDevices",
    "OptionTable",
    "bool_text",
    "choice_text",
    "nonnegative_int_text",
    "nonnegative_number_text",
]
