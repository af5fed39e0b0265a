"""Single-device and data-parallel strategies (GPU with nccl, CPU with gloo), on the job's mesh.

``DDPStrategy`` replicates the model over the mesh's ``dp`` processes: torch's
``DistributedDataParallel`` for plain models; FSDP2-based replicas for models tensor parallelism
has split (``transforms.data_parallel``). Tensor parallelism itself is an earlier transform.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from ..configuration import DistributedDataParallelKwargs
from ..enums import DistributedType
from .base import Strategy


def wrap_in_ddp(
    model: torch.nn.Module,
    ddp_kwargs: DistributedDataParallelKwargs | None,
    device: torch.device,
    process_group: Any = None,
) -> DistributedDataParallel:
    """``DistributedDataParallel`` over ``process_group`` (default: all processes) with the user's
    ``DistributedDataParallelKwargs``; on an accelerator, pinned to this process's device."""
    kwargs: dict[str, Any] = ddp_kwargs.to_kwargs() if ddp_kwargs is not None else {}
    if device.type in ("cuda", "xpu"):
        kwargs.setdefault("device_ids", [device.index])
        kwargs.setdefault("output_device", device.index)
    return DistributedDataParallel(model, process_group=process_group, **kwargs)


class SingleDeviceStrategy(Strategy):
    """One process on one device (CPU, one GPU, MPS)."""

    name: ClassVar[str] = "single_device"


class DDPStrategy(Strategy):
    """Data parallelism over the mesh's ``dp`` (all processes, unless tensor parallelism takes some).

    Models without trainable parameters are only moved to the device (DDP refuses them, and
    there is nothing to synchronise).
    """

    name: ClassVar[str] = "ddp"

    def __init__(self, ddp_kwargs: DistributedDataParallelKwargs | None = None) -> None:
        super().__init__()
        self.ddp_kwargs = ddp_kwargs

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any]) -> DDPStrategy:
        """DDP takes no plugin; its settings come from ``DistributedDataParallelKwargs``."""
        if plugin is not None:
            raise TypeError(f"The ddp strategy takes no plugin, got {type(plugin).__name__}.")
        return cls(handlers.get(DistributedDataParallelKwargs))

    @property
    def distributed_type(self) -> DistributedType:
        return {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU}.get(
            self.context.device.type, DistributedType.MULTI_CPU
        )

    def prepare_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        from ..transforms.data_parallel import is_replicated, replicate
        from ..transforms.state_dict import has_dtensors

        model = super().prepare_model(model, device_placement)
        dims = self.context.dims
        if isinstance(model, DistributedDataParallel) or is_replicated(model) or dims.dp.size == 1:
            return model
        if not any(p.requires_grad for p in model.parameters()):
            return model
        if has_dtensors(model):
            return replicate(model, dims, self.blocks(model))
        return wrap_in_ddp(model, self.ddp_kwargs, self.context.device, dims.dp.group)

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skips the gradient all-reduce inside the block (for accumulation micro-steps)."""
        from ..transforms.data_parallel import is_replicated

        if isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        elif is_replicated(model):
            model.set_requires_gradient_sync(False)  # type: ignore[operator]
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)  # type: ignore[operator]
        else:
            yield
