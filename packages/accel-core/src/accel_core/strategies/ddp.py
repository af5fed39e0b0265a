"""Single-device and DistributedDataParallel strategies (GPU with nccl, CPU with gloo)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from ..configuration import DistributedDataParallelKwargs
from ..enums import DistributedType
from .base import Strategy


class SingleDeviceStrategy(Strategy):
    """One process on one device (CPU, one GPU, MPS)."""

    name: ClassVar[str] = "single_device"


class DDPStrategy(Strategy):
    """Data parallelism with ``torch.nn.parallel.DistributedDataParallel``.

    Models without trainable parameters are only moved to the device (DDP refuses them, and
    there is nothing to synchronise).
    """

    name: ClassVar[str] = "ddp"

    def __init__(self, ddp_kwargs: DistributedDataParallelKwargs | None = None) -> None:
        super().__init__()
        self.ddp_kwargs = ddp_kwargs

    @property
    def distributed_type(self) -> DistributedType:
        return {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU}.get(
            self.state.device.type, DistributedType.MULTI_CPU
        )

    def prepare_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        model = super().prepare_model(model, device_placement)
        if isinstance(model, DistributedDataParallel) or not any(p.requires_grad for p in model.parameters()):
            return model
        kwargs: dict[str, Any] = self.ddp_kwargs.to_kwargs() if self.ddp_kwargs is not None else {}
        device = self.state.device
        if device.type in ("cuda", "xpu"):
            kwargs.setdefault("device_ids", [device.index])
            kwargs.setdefault("output_device", device.index)
        return DistributedDataParallel(model, **kwargs)

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skips DDP's gradient all-reduce inside the block (for accumulation micro-steps)."""
        context = model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()
        with context:
            yield
