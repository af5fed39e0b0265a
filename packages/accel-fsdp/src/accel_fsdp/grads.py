"""Gradient clipping over sharded gradients: the norm is the global one, as if nothing were sharded."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch


def total_norm(grads: Sequence[torch.Tensor], norm_type: float) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients together, identical on every process.

    DTensor gradients (FSDP2) get their global norm from DTensor itself, which knows which
    placements are shards (summed across processes) and which are replicas (counted once); plain
    tensors (parameters FSDP ignores) count as they are on this process.
    """
    from torch.distributed.tensor import DTensor

    norm_type = float(norm_type)
    by_mesh: dict[int, list[torch.Tensor]] = defaultdict(list)
    plain: list[torch.Tensor] = []
    for grad in grads:
        if isinstance(grad, DTensor):
            by_mesh[id(grad.device_mesh)].append(grad)
        else:
            plain.append(grad)
    norms: list[torch.Tensor] = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if plain:
        norms.append(torch.nn.utils.get_total_norm(plain, norm_type))
    if not norms:
        return torch.tensor(0.0)
    device = norms[0].device
    stacked = torch.stack([n.to(device=device, dtype=torch.float32) for n in norms])
    return torch.linalg.vector_norm(stacked, norm_type)


def clip_grad_norm_(parameters: Sequence[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Scales the gradients so their global norm is at most ``max_norm``; returns the norm before clipping."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = total_norm(grads, norm_type)
    if not grads:
        return norm
    coefficient = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
    # Scale the local pieces in place: one foreach call per device and dtype, no DTensor dispatch.
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for grad in grads:
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        groups[(local.device, local.dtype)].append(local)
    with torch.no_grad():
        for (device, dtype), tensors in groups.items():
            torch._foreach_mul_(tensors, coefficient.to(device=device, dtype=dtype))
    return norm
