"""Process state shared by everything in one process: who am I, how many are we, which device.

``PartialState`` (``process_state``) is created once per process (later instances share the first
one's state, so any module can ask ``PartialState().process_index`` cheaply). ``AcceleratorState``
(``accelerator_state``) adds what the ``Accelerator`` decided (precision, strategy);
``GradientState`` (``gradient_state``) tracks accumulation and the end of the data.
"""

from __future__ import annotations

from .accelerator_state import AcceleratorSetup, AcceleratorState
from .gradient_state import GradientState
from .process_state import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    PartialState,
    StateResetError,
    collective_timeout,
    default_backend,
)

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT",
    "AcceleratorSetup",
    "AcceleratorState",
    "GradientState",
    "PartialState",
    "StateResetError",
    "collective_timeout",
    "default_backend",
]
