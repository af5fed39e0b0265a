"""accel-deepspeed: the ``deepspeed`` strategy of accel (DeepSpeed ZeRO stages 1, 2 and 3).

Names are imported on first use: ``import accel_deepspeed`` imports neither torch nor deepspeed
(``accel launch`` loads ``accel_deepspeed.cli`` for its flags).

Example::

    from accel import Accelerator
    from accel_deepspeed import DeepSpeedPlugin

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "DeepSpeedStrategy": ".strategy",
    "DeepSpeedPlugin": ".plugin",
    "DummyOptim": ".dummy",
    "DummyScheduler": ".dummy",
    "DeepSpeedOptimizerWrapper": ".wrappers",
    "DeepSpeedSchedulerWrapper": ".wrappers",
    "DeepSpeedLaunchOptions": ".cli",
    "HfDeepSpeedConfig": ".hf_config",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
