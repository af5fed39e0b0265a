"""``accel.local_sgd``: ``LocalSGD`` (the reference's ``accelerate.local_sgd``)."""

from __future__ import annotations

from accel_core.local_sgd import LocalSGD

__all__ = ["LocalSGD"]
