"""tests/xla: the xla strategy. Tests marked ``xla_device`` need torch-xla (their own environment:
tests/xla/setup.sh, then tests/xla/run.sh) and are skipped where it is absent (the workspace's main
environment, whose torch is newer than torch-xla's); the rest run everywhere."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator

import pytest

HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None

# XLA's CPU device, one replica; set before torch_xla is first imported. Only in the XLA environment: in the
# main one it would leak into every later test of the session and make them pick the xla strategy.
if HAS_TORCH_XLA:
    os.environ.setdefault("PJRT_DEVICE", "CPU")


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    """Every test starts and ends without process state (each one builds its own Accelerator)."""
    from accel_core.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
