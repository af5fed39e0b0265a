"""DeepSpeed's precision: the engine computes in fp16 / bf16 from its config, so core has nothing to do."""

from __future__ import annotations

from accel_core.precision.modes import Precision


class DeepSpeedPrecision(Precision):
    """The mode DeepSpeed's engine runs (its config's ``fp16`` / ``bf16`` sections, settled by the plugin).

    Every hook is a pass-through: the engine casts, scales the loss and skips overflowing steps
    itself, so core adds no autocast and no GradScaler.
    """
