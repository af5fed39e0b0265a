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

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "FSDPStrategy": "strategy",
    "FullyShardedDataParallelPlugin": "plugin",
    "FSDPLaunchOptions": "cli",
    "local_bytes": "fsdp2",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accel_fsdp' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
