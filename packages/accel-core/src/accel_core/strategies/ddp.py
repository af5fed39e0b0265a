"""Single-device and data-parallel strategies (GPU with nccl, CPU with gloo), on the job's mesh.

``DDPStrategy`` replicates the model over the mesh's ``dp`` processes: torch's
``DistributedDataParallel`` for plain models; FSDP2-based replicas for models tensor parallelism
has split and for pipeline stages (``transforms.data_parallel``). Tensor parallelism itself is an earlier transform.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..configuration import DistributedDataParallelKwargs
from ..enums import DistributedType
from ..state.process_state import group_timeout
from .base import Strategy

if TYPE_CHECKING:
    from ..settings import RunSettings


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
    process_group = group_ddp_can_log(process_group)
    wrapped = DistributedDataParallel(model, process_group=process_group, **kwargs)
    if ddp_kwargs is not None:
        register_comm_hook(wrapped, ddp_kwargs, process_group)
    return wrapped


def group_ddp_can_log(process_group: Any) -> Any:
    """``process_group``, or under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on gloo the same ranks in a group without torch's
    checking wrapper.

    DDP's constructor logs its set-up, and for a gloo group reads the thread count of the group's backend through a
    cast to ProcessGroupGloo; under DETAIL that backend is the checking wrapper, and the cast crashes every process
    (SIGSEGV in ``c10d::Logger::set_env_variables``; torch 2.9 to 2.15, any CPU job in debug mode: ``accel launch
    --debug``, ``ACCEL_DEBUG_MODE``). DDP's own all-reduces then run unchecked; every other collective keeps the
    checks. Only the group's members make it (``use_local_synchronization``): each data-parallel group its own.
    """
    if not dist.is_initialized() or dist.get_debug_level() != dist.DebugLevel.DETAIL:
        return process_group
    group = process_group if process_group is not None else dist.group.WORLD
    if dist.get_backend(group) != "gloo":
        return process_group
    ranks = dist.get_process_group_ranks(group)
    dist.set_debug_level(dist.DebugLevel.INFO)  # read when the group is made: no wrapper around this one
    try:
        return dist.new_group(ranks, backend="gloo", timeout=group_timeout(), use_local_synchronization=True)
    finally:
        dist.set_debug_level(dist.DebugLevel.DETAIL)


def register_comm_hook(
    model: DistributedDataParallel, ddp_kwargs: DistributedDataParallelKwargs, process_group: Any = None
) -> None:
    """Registers the communication hook ``ddp_kwargs.comm_hook`` names (wrapped by ``comm_wrapper``) on ``model``.

    Power-SGD keeps its state (error feedback, warm-started factors) in a ``PowerSGDState`` over
    ``process_group``, built with ``comm_state_option``.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hooks = {
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "power_sgd": powerSGD_hook.powerSGD_hook,
        "batched_power_sgd": powerSGD_hook.batched_powerSGD_hook,
    }
    wrappers = {"fp16": default_hooks.fp16_compress_wrapper, "bf16": default_hooks.bf16_compress_wrapper}
    hook = hooks.get(str(ddp_kwargs.comm_hook))
    if hook is None:
        return
    wrapper = wrappers.get(str(ddp_kwargs.comm_wrapper))
    if wrapper is not None:
        hook = wrapper(hook)
    state: Any = process_group  # the default hooks take the process group as their state (None: the world)
    if str(ddp_kwargs.comm_hook) in ("power_sgd", "batched_power_sgd"):
        state = powerSGD_hook.PowerSGDState(process_group, **ddp_kwargs.comm_state_option)
    model.register_comm_hook(state=state, hook=hook)


def unwrap_ddp(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a ``DistributedDataParallel`` wrapper (any other model as it is)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


@contextlib.contextmanager
def data_parallel_no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Skips the gradient all-reduce inside the block (for accumulation micro-steps).

    Knows torch's ``DistributedDataParallel`` and the FSDP2-based replicas of ``transforms.data_parallel``;
    any other model runs the block as it is. DDPStrategy's ``no_sync``, and accel-megatron's.
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):  # transforms.data_parallel.is_replicated
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


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
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any], settings: RunSettings) -> DDPStrategy:
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
        if has_dtensors(model) or dims.config.pp_enabled:
            # A pipeline stage runs several micro-batches' backwards per step, which DDP's bucket rebuilding refuses.
            return replicate(model, dims, self.blocks(model))
        return wrap_in_ddp(model, self.ddp_kwargs, self.context.device, dims.dp.group)

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return unwrap_ddp(model)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skips the gradient all-reduce inside the block (for accumulation micro-steps)."""
        return data_parallel_no_sync(model)
