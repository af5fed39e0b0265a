"""accel-megatron: the ``megatron`` strategy of accel (Megatron-core tensor, pipeline and data parallelism).

Names are imported on first use: ``import accel_megatron`` imports neither torch nor megatron
(``accel launch`` loads ``accel_megatron.cli`` for its flags).

Example::

    from accel import Accelerator
    from accel_megatron import MegatronLMPlugin
    from megatron.core import tensor_parallel

    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    config = accelerator.strategy.model_parallel_config()          # TP size, CPU init on CPU runs
    model = torch.nn.Sequential(...)                                # built from tensor_parallel layers
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "MegatronStrategy": ".strategy",
    "MegatronLMPlugin": ".plugin",
    "MegatronLaunchOptions": ".cli",
    "MegatronLMDummyScheduler": ".scheduler",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
