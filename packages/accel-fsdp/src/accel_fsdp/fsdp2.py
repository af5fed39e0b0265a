"""FSDP2: ``fully_shard`` on each chosen unit and on the root, over the job mesh's data-parallel dimensions.

The data-parallel step of FSDP2's chain (``accel_fsdp.parallelize``): tensor parallelism, activation
checkpointing and per-unit compile happened before; a tensor-parallel model's DTensor parameters are
sharded again over ``dp_shard_cp`` (2-D: FSDP x TP).

Also the memory-efficient start, decided once (``_weights_source``) before anything is sharded: a model
built on the meta device on every process gets memory for its shard only and is initialised there
(``accel_core.transforms.meta_init.materialize``: ``param_init_fn`` / the model's ``init_weights`` /
``reset_parameters``, refusing modules none of them covers); process 0's weights (only process 0 has
any, ``cpu_ram_efficient_loading``; or ``sync_module_states``) are set aside, and every process shards
a meta copy and receives its shards of them (``set_model_state_dict(..., broadcast_from_rank0=True)``,
as Accelerate does for FSDP2).
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


def _weights_source(model: nn.Module, group: Any, sync_module_states: bool) -> str:
    """Where the shards' values come from: "real" (each process's own model, as it is), "meta" (every process built
    it on the meta device: each initialises its shards) or "rank0" (process 0's weights, scattered shard by shard:
    only process 0 built it on a real device, as with ``cpu_ram_efficient_loading``, or every process did and
    ``sync_module_states`` asks for process 0's).

    Collective, so that an inconsistent layout fails on every process instead of hanging one.
    """
    tensors = list(model.parameters()) + list(model.buffers())
    local = 1 if any(t.is_meta for t in tensors) else 0
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return "meta" if local else "real"
    flags: list[int | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(flags, local, group=group)
    if not any(flags):
        return "rank0" if sync_module_states else "real"
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


def _set_aside(model: nn.Module, group: Any) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Process 0's weights (state dict and non-persistent buffers) copied to the CPU, to be scattered once the model
    is sharded (nothing on the other processes); then every process's model goes to the meta device, so that each
    allocates its shards only."""
    state: dict[str, torch.Tensor] = {}
    buffers: list[torch.Tensor] = []
    if dist.get_rank() == source_rank(group):
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        buffers = [getattr(m, n).detach().cpu() for m, n in _non_persistent_buffers(model)]
    model.to("meta")
    return state, buffers


def _scatter_from_rank0(model: nn.Module, state: dict[str, Any], buffers: list[torch.Tensor], group: Any) -> None:
    """Each process's shards of process 0's weights (``state``, ``buffers``: ``_set_aside``), into the sharded model
    allocated on the compute device (NCCL sends GPU tensors only)."""
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
    (now an ``FSDPModule``), its shards given their values where the model had none (see the module docstring).

    units, ignored: the plugin's wrap policy and ignored modules applied to ``model`` (``policies.units_to_wrap``,
    ``policies.ignored_modules``), whose parameters stay whole.
    mesh: the data-parallel sub-mesh (1-D ``dp_shard_cp``, or 2-D ``(dp_replicate, dp_shard_cp)`` for HSDP).
    precision: the Accelerator's Precision (its ``mixed_precision_policy`` unless the plugin has one).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard, register_fsdp_forward_method

    from accel_core.transforms.meta_init import materialize

    if is_fsdp2(model):  # the user sharded it already ("manual wrapping")
        return model
    inside = {id(module) for module in model.modules()}
    if any(id(unit) not in inside for unit in units):
        raise ValueError(
            f"Some units to shard are no longer modules of {type(model).__name__}: they were chosen on the model as "
            "built, and the tensor-parallel step (a parallelize_fn, or the model's parallelize method) replaced them. "
            "Keep the module objects while splitting them (parallelize_module does), or shard the model yourself "
            "with fully_shard before prepare."
        )
    group = mesh.get_group() if mesh.ndim == 1 else None
    source = _weights_source(model, group, plugin.sync_module_states)
    held, held_buffers = _set_aside(model, group) if source == "rank0" else ({}, [])

    offload: Any = plugin.cpu_offload if isinstance(plugin.cpu_offload, OffloadPolicy) else None
    if offload is None:
        offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if plugin.offload_params else OffloadPolicy()
    options = {
        "mesh": mesh,
        "reshard_after_forward": policies.reshard_after_forward(plugin),
        "mp_policy": policies.fsdp2_mixed_precision(plugin.mixed_precision_policy, precision),
        "offload_policy": offload,
    }
    ignored_params = {p for module in ignored for p in module.parameters()}
    for unit in units:
        inside = {p for p in unit.parameters() if p in ignored_params}
        fully_shard(unit, **options, ignored_params=inside or None)
    fully_shard(model, **options, ignored_params=ignored_params or None)  # no collective: processes still agree here
    for name in plugin.forward_methods:
        if callable(getattr(type(model), name, None)):
            register_fsdp_forward_method(model, name)

    # Memory for this process's shards only, on the compute device even when offloading: the initialisers and
    # process 0's broadcast run there (NCCL sends GPU tensors only), and buffers stay there (FSDP2 offloads
    # parameters, not buffers). Then the offload policy's shards go to the CPU.
    if source == "rank0":
        model.to_empty(device=device)
        _scatter_from_rank0(model, held, held_buffers, group)
    elif source == "meta":
        materialize(model, device, plugin.param_init_fn)
    if source != "real" and isinstance(offload, CPUOffloadPolicy):
        _offload_parameters(model)
    return model


def local_bytes(model: nn.Module) -> int:
    """Bytes of parameters this process holds (its shards; whole tensors for unsharded ones)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        total += local.numel() * local.element_size()
    return total
