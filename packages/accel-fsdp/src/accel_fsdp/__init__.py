"""accel-fsdp: the ``fsdp`` strategy of accel (FSDP2 ``fully_shard`` by default, FSDP1 on request).

Names are imported on first use: ``import accel_fsdp`` does not import torch (``accel launch``
loads ``accel_fsdp.cli`` for its flags).

Example::

    from accel import Accelerator
    from accel_fsdp import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["Block"])
    accelerator = Accelerator(fsdp_plugin=plugin)
    model, optimizer = accelerator.prepare(model, optimizer)
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "FSDPStrategy": "strategy",
    "FullyShardedDataParallelPlugin": "plugin",
    "FSDPLaunchOptions": "cli",
    "local_bytes": "fsdp2",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), {n: f".{m}" for n, m in _EXPORTS.items()})
