"""``accel.utils.deepspeed``: the names of ``accelerate.utils.deepspeed``, from ``accel.utils``.

The same objects as ``accel.utils``'s, imported on first use.
"""

from __future__ import annotations

from accel.utils import _submodule_exports

_NAMES = ("DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper", "DummyOptim", "DummyScheduler", "HfDeepSpeedConfig")

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _submodule_exports(globals(), _NAMES)
