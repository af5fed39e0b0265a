"""accel-xla: the ``xla`` strategy of accel, for TPUs (and any device torch-xla's PJRT runtime drives).

Names are imported on first use: ``import accel_xla`` imports neither torch nor torch_xla
(``accel launch`` loads ``accel_xla.cli`` for its flags).

Example::

    # PJRT_DEVICE=TPU accel launch --use-xla train.py   (or PJRT_DEVICE=CPU to try it on a laptop)
    from accel import Accelerator

    accelerator = Accelerator(strategy="xla", mixed_precision="bf16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "XlaStrategy": "strategy",
    "XlaCollectives": "collectives",
    "XlaDeviceLoader": "loader",
    "XlaLaunchOptions": "cli",
    "require_torch_xla": "runtime",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), {n: f".{m}" for n, m in _EXPORTS.items()})
