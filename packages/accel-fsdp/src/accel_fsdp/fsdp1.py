"""FSDP1: ``FullyShardedDataParallel`` around the model, for code and checkpoints that need it.

On the CPU it needs ``device_id=torch.device("cpu")`` (without it FSDP1 looks for a GPU), and it
cannot offload parameters (its offload path copies to CUDA), so ``cpu_offload`` is ignored there.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.fsdp import FullyShardedDataParallel

from . import policies
from .plugin import FullyShardedDataParallelPlugin

logger = logging.getLogger("accel_fsdp")


def fsdp1_class() -> Any:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel


def is_fsdp1(model: nn.Module) -> TypeGuard[FullyShardedDataParallel]:
    return isinstance(model, fsdp1_class())


def wrap_model(
    model: nn.Module,
    plugin: FullyShardedDataParallelPlugin,
    *,
    device: torch.device,
    precision: Any,
    mesh: Any = None,
    is_main_process: bool = True,
) -> nn.Module:
    """Wraps ``model`` in ``FullyShardedDataParallel`` as the plugin says."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy
    from torch.distributed.fsdp.wrap import CustomPolicy

    FSDP = fsdp1_class()
    if isinstance(model, FSDP):
        return model
    ignored = policies.ignored_modules(model, plugin.ignored_modules)
    user_policy = plugin.auto_wrap_policy if callable(plugin.auto_wrap_policy) else None
    units = [] if user_policy is not None else policies.units_to_wrap(model, plugin, ignored)
    unit_ids = {id(u) for u in units}

    kwargs: dict[str, Any] = {
        "sharding_strategy": ShardingStrategy[plugin.sharding_strategy],
        "auto_wrap_policy": user_policy or (CustomPolicy(lambda module: id(module) in unit_ids) if units else None),
        "mixed_precision": policies.fsdp1_mixed_precision(plugin.mixed_precision_policy, precision),
        "ignored_modules": ignored or None,
        "device_id": device if device.type == "cpu" else (device.index if device.index is not None else device),
        "sync_module_states": plugin.sync_module_states,
        "forward_prefetch": plugin.forward_prefetch,
        "limit_all_gathers": plugin.limit_all_gathers,
        "use_orig_params": plugin.use_orig_params,
    }
    if plugin.backward_prefetch is not None:
        kwargs["backward_prefetch"] = (
            None if plugin.backward_prefetch == "NO_PREFETCH" else BackwardPrefetch[plugin.backward_prefetch]
        )
    if plugin.offload_params:
        if device.type == "cpu":
            if is_main_process:
                logger.info("accel-fsdp: cpu_offload is ignored on the CPU (the parameters are in CPU memory already).")
        else:
            kwargs["cpu_offload"] = (
                plugin.cpu_offload if isinstance(plugin.cpu_offload, CPUOffload) else CPUOffload(offload_params=True)
            )
    if plugin.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        kwargs["device_mesh"] = mesh
    if plugin.param_init_fn is not None:
        kwargs["param_init_fn"] = plugin.param_init_fn
    elif plugin.cpu_ram_efficient_loading and not is_main_process:
        # Meta modules only need memory: sync_module_states then fills them with process 0's values.
        kwargs["param_init_fn"] = lambda module: module.to_empty(device=device, recurse=False)

    wrapped = FSDP(model, **kwargs)

    if plugin.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl,
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        if user_policy is not None:  # the units FSDP chose with the user's policy
            unit_ids = {id(m.module) for m in wrapped.modules() if isinstance(m, FSDP) and m is not wrapped}
        apply_activation_checkpointing(
            wrapped,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda module: id(module) in unit_ids,
        )

    for name in plugin.forward_methods:
        _gather_for_method(wrapped, name)
    return wrapped


def _gather_for_method(wrapped: nn.Module, name: str) -> None:
    """Makes ``wrapped.<name>(...)`` (e.g. ``generate``) run with the root's parameters gathered.

    FSDP1 gathers parameters only around ``forward``; inner units still gather themselves when
    called, so only the root's own parameters need summoning (``recurse=False``).
    """
    inner = wrapped.module
    method = getattr(inner, name, None)
    if not callable(method) or not callable(getattr(type(inner), name, None)):
        return
    FSDP = fsdp1_class()

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        with FSDP.summon_full_params(wrapped, writeback=False, recurse=False):
            return method(*args, **kwargs)

    object.__setattr__(wrapped, name, run)
