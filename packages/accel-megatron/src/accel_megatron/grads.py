"""Gradients of a tensor-parallel model: the global norm and clipping, and sequence-parallel reduction.

The norm is the one the unsplit model would have: a TP-sharded parameter contributes its shard on
every TP rank (the shards together are the whole gradient); a replicated parameter contributes once,
from TP rank 0 (Megatron's ``param_is_not_tensor_parallel_duplicate``). Contributions are summed
over the model-parallel group. Data-parallel replicas are not summed: after the data-parallel
all-reduce their gradients are the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

from accel_core.grads import clip_to_norm_, communication_device

from .groups import model_parallel_group, tensor_parallel_group


def total_norm(params: Sequence[torch.nn.Parameter], norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of all the parameters' gradients as one model, the same on every process. Collective."""
    norm_type = float(norm_type)
    counted = [p.grad.detach() for p in params if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)]
    # A rank with nothing to count (replicated layers on TP rank > 0, an empty stage) still all-reduces its zero:
    # on the device the backend takes (NCCL refuses CPU tensors), as accel-core's own norm does.
    device = communication_device(counted[0].device if counted else torch.device("cpu"))
    group = model_parallel_group()
    if norm_type == float("inf"):
        local = (
            torch.stack([g.abs().max().float() for g in counted]).max() if counted else torch.zeros((), device=device)
        )
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
        return local
    local = sum(
        (torch.linalg.vector_norm(g.float(), norm_type) ** norm_type for g in counted), torch.zeros((), device=device)
    )
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
    return local ** (1.0 / norm_type)


def clip_grad_norm_(params: Sequence[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scales every gradient so the global norm is at most ``max_norm``; returns the norm before clipping."""
    params = list(params)
    norm = total_norm(params, norm_type)
    clip_to_norm_(params, norm, max_norm)
    return norm


def allreduce_sequence_parallel_grads(params: Sequence[torch.nn.Parameter]) -> None:
    """Sums over the TP group the gradients of parameters used on sequence shards (LayerNorms, biases
    marked ``sequence_parallel``), as Megatron's ``finalize_model_grads`` does. Collective over TP."""
    grads = [p.grad for p in params if p.grad is not None and getattr(p, "sequence_parallel", False)]
    if not grads:
        return
    group = tensor_parallel_group()
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def average_over(params: Sequence[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    """Averages the gradients over ``group`` (data parallelism without a DDP wrapper). Collective over ``group``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
