"""FSDP2: ``fully_shard`` on each chosen unit and on the root, over the job mesh's data-parallel dimensions.

The data-parallel step of FSDP2's chain (``accel_fsdp.parallelize``): tensor parallelism, activation
checkpointing and per-unit compile happened before; a tensor-parallel model's DTensor parameters are
sharded again over ``dp_shard_cp`` (2-D: FSDP x TP).

Also the memory-efficient start: a model built on the meta device (on every process, or on every
process but 0 with ``cpu_ram_efficient_loading``) gets memory for its shard only, then is
initialised (``param_init_fn`` / the model's ``init_weights`` / ``reset_parameters``, refusing
modules none of them covers) or receives process 0's weights shard by shard.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import policies
from .plugin import FullyShardedDataParallelPlugin


def is_fsdp2(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _meta_layout(model: nn.Module, group: Any) -> str:
    """ "real", "meta" (every process built it on the meta device) or "rank0" (only process 0 has weights).

    Collective, so that an inconsistent layout fails on every process instead of hanging one.
    """
    tensors = list(model.parameters()) + list(model.buffers())
    local = 1 if any(t.is_meta for t in tensors) else 0
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return "meta" if local else "real"
    flags: list[int | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(flags, local, group=group)
    if not any(flags):
        return "real"
    if all(flags):
        return "meta"
    if flags[0] == 0 and all(flags[1:]):
        return "rank0"
    raise ValueError(
        f"The model is on the meta device on processes {[i for i, f in enumerate(flags) if f]} only. Build it on the "
        "meta device everywhere (it is then initialised shard by shard), or everywhere but on process 0 with "
        "cpu_ram_efficient_loading=True (process 0's weights are then scattered)."
    )


def source_rank(group: Any) -> int:
    """The global rank of the first process of ``group`` (None: the whole world)."""
    return dist.get_global_rank(group, 0) if group is not None else 0


def _broadcast_states(model: nn.Module, group: Any) -> None:
    """``sync_module_states``: every process starts from process 0's parameters and buffers.

    The model may still be on the CPU (``fully_shard`` moves it to the GPU afterwards): each tensor then
    travels through a copy on the device the backend takes (NCCL refuses CPU tensors: "No backend type
    associated with device type cpu"), one tensor at a time.
    """
    from accel_core.grads import communication_device

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    source = source_rank(group)
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            target = communication_device(tensor.device)
            if target == tensor.device:
                dist.broadcast(tensor.data, src=source, group=group)
                continue
            sent = tensor.data.to(target)
            dist.broadcast(sent, src=source, group=group)
            tensor.data.copy_(sent)


def _buffers_to(model: nn.Module, device: torch.device) -> None:
    """Every buffer on the compute device, as ``fully_shard`` leaves a real model's: an ``init_weights`` that
    assigns a new tensor to a buffer (a rotary table computed on the CPU) would otherwise leave it there."""
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)


def _offload_parameters(model: nn.Module) -> None:
    """Moves the sharded parameters to the CPU, where FSDP2's ``CPUOffloadPolicy`` keeps them between uses (it
    refuses others at the first forward; it pins them itself when its policy says so). Buffers stay where they
    are: FSDP2 offloads parameters only, so a buffer on the CPU would meet GPU activations in the forward."""
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if not isinstance(param, DTensor) or param.device.type == "cpu":
            continue  # there already, or a parameter FSDP ignores (whole, on the compute device)
        with torch.no_grad():  # as fully_shard moves a DTensor parameter: swapped, so FSDP keeps the same object
            moved = nn.Parameter(param.to("cpu"), requires_grad=param.requires_grad)
        torch.utils.swap_tensors(param, moved)


def _non_persistent_buffers(model: nn.Module) -> list[tuple[nn.Module, str]]:
    found = []
    for module in model.modules():
        for name in sorted(module._non_persistent_buffers_set):
            if getattr(module, name, None) is not None:
                found.append((module, name))
    return found


def shard_model(
    model: nn.Module,
    plugin: FullyShardedDataParallelPlugin,
    *,
    units: list[nn.Module],
    ignored: list[nn.Module],
    mesh: Any,
    device: torch.device,
    precision: Any,
) -> nn.Module:
    """Applies ``fully_shard`` to each of ``units`` and to the root, as the plugin says; returns the same module object
    (now an ``FSDPModule``).

    units, ignored: the plugin's wrap policy and ignored modules applied to ``model`` (``policies.units_to_wrap``,
    ``policies.ignored_modules``), whose parameters stay whole.
    mesh: the data-parallel sub-mesh (1-D ``dp_shard_cp``, or 2-D ``(dp_replicate, dp_shard_cp)`` for HSDP).
    precision: the Accelerator's Precision (its ``mixed_precision_policy`` unless the plugin has one).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard, register_fsdp_forward_method

    from accel_core.transforms.meta_init import check_initialisable, initialise

    if is_fsdp2(model):  # the user sharded it already ("manual wrapping")
        return model
    group = mesh.get_group() if mesh.ndim == 1 else None
    layout = _meta_layout(model, group)
    if layout == "meta":
        check_initialisable(model, plugin.param_init_fn)  # before any memory or communication
    ignored_params = {p for module in ignored for p in module.parameters()}

    held: dict[str, torch.Tensor] = {}
    saved_buffers: list[torch.Tensor] = []
    if layout == "rank0":
        # Process 0 keeps its weights aside (on the CPU) and shards a meta copy like the others.
        if dist.get_rank() == source_rank(group):
            held = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            saved_buffers = [getattr(m, n).detach().cpu() for m, n in _non_persistent_buffers(model)]
        model.to("meta")
    elif layout == "real" and plugin.sync_module_states:
        _broadcast_states(model, group)

    offload_to_cpu = plugin.offload_params
    offload: Any = plugin.cpu_offload if isinstance(plugin.cpu_offload, OffloadPolicy) else None
    if offload is None:
        offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload_to_cpu else OffloadPolicy()
    options = {
        "mesh": mesh,
        "reshard_after_forward": policies.reshard_after_forward(plugin),
        "mp_policy": policies.fsdp2_mixed_precision(plugin.mixed_precision_policy, precision),
        "offload_policy": offload,
    }
    for unit in units:
        inside = {p for p in unit.parameters() if p in ignored_params}
        fully_shard(unit, **options, ignored_params=inside or None)
    fully_shard(model, **options, ignored_params=ignored_params or None)

    if layout != "real":
        # Memory for this process's shards only, on the compute device even when offloading: the initialisers
        # and process 0's broadcast run there (NCCL sends GPU tensors only), and buffers stay there (FSDP2
        # offloads parameters, not buffers). Then the offload policy's shards go to the CPU.
        model.to_empty(device=device)
        if layout == "meta":
            initialise(model, plugin.param_init_fn)
        else:
            _scatter_from_rank0(model, held, saved_buffers, group)
        _buffers_to(model, device)
        if isinstance(offload, CPUOffloadPolicy):
            _offload_parameters(model)

    for name in plugin.forward_methods:
        if callable(getattr(type(model), name, None)):
            register_fsdp_forward_method(model, name)
    return model


def _scatter_from_rank0(model: nn.Module, state: dict[str, Any], buffers: list[torch.Tensor], group: Any) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    # Non-persistent buffers (rotary tables, masks) are outside the state dict: send them too.
    source = source_rank(group)
    with torch.no_grad():
        for i, (module, name) in enumerate(_non_persistent_buffers(model)):
            tensor = getattr(module, name)
            if buffers:
                tensor.copy_(buffers[i])
            dist.broadcast(tensor, src=source, group=group)


def local_bytes(model: nn.Module) -> int:
    """Bytes of parameters this process holds (its shards; whole tensors for unsharded ones)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size()
    return total
