"""Gradient norms and clipping over the whole mesh: the norm of the full model's gradients, whatever the layout.

A DTensor gradient (tensor parallel, FSDP2, HSDP) holds one piece of a tensor; pieces on
replicated mesh dimensions are copies. Each process adds ``|piece|^p`` divided by the number of
processes holding that same piece, and one ``all_reduce`` over all processes sums the pieces:
exactly the single-process norm, in one collective, for any mix of meshes and placements.
(DTensor's own ``get_total_norm(...).full_tensor()`` reduces per mesh dimension and warns at each
step on multi-dimensional meshes.) Plain gradients are the same on every process (DDP), or are
the process's own (parameters FSDP ignores), and count as they are here.

With pipeline parallelism each ``pp`` rank holds other parameters: DTensor pieces are not copies
across ``pp`` (their meshes leave it out), and plain gradients' ``|g|^p`` are summed over the
pipeline group.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

    from .parallel.dims import MeshGroup


def _copies(grad: DTensor, world: int) -> int:
    """How many processes hold the same piece as this one: replicated mesh dimensions, and copies of the mesh."""
    mesh = grad.device_mesh
    replicated = math.prod(mesh.size(i) for i, placement in enumerate(grad.placements) if placement.is_replicate())
    return replicated * (world // mesh.size())


def local_pieces(grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each gradient's piece held by this process: a DTensor's local tensor, a plain tensor as it is.

    Not ``to_local()``: that is an autograd Function returning a fresh view (``view_as``) so that autograd can
    differentiate through it; gradients are read here outside autograd, where the view is pointless: a Python
    autograd call and two aten operators per parameter, twice per clip (49 of the 104 operators accel's FSDP2
    step ran beyond raw ``fully_shard``'s in bench/fsdp2_step.py). ``_local_tensor`` is the tensor that view is
    taken of (same storage, shape and strides: the norm is unchanged bit for bit); torch's own FSDP2 and
    distributed checkpoint read it the same way.
    """
    from torch.distributed.tensor import DTensor

    return [g._local_tensor if isinstance(g, DTensor) else g for g in grads]


def communication_device(local: torch.device) -> torch.device:
    """Where a tensor reduced over the default group's backend must live: the current GPU under NCCL (which
    refuses CPU tensors: "No backend type associated with device type cpu"), else ``local``. A process with
    nothing to count still all-reduces its zero, so it asks here rather than defaulting to the CPU."""
    backend = str(dist.get_backend()).lower()
    if "nccl" in backend and local.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return local


def total_norm(
    parameters: Sequence[torch.nn.Parameter], norm_type: float = 2.0, pipeline: MeshGroup | None = None
) -> torch.Tensor:
    """The ``norm_type``-norm of all gradients of ``parameters`` as one vector; identical on every process. Collective
    when any parameter is a DTensor (every process must call it with the same parameters), and over ``pipeline``
    (the ``pp`` group: each rank passes its own stages' parameters) when given with more than one rank."""
    from torch.distributed.tensor import DTensor, Replicate

    norm_type = float(norm_type)
    grads = [p.grad for p in parameters if p.grad is not None]
    plain = [g for g in grads if not isinstance(g, DTensor)]
    pieces = [g for g in grads if isinstance(g, DTensor)]
    distributed = dist.is_available() and dist.is_initialized() and any(isinstance(p, DTensor) for p in parameters)
    device = local_pieces(grads[:1])[0].device if grads else torch.device("cpu")
    norms: list[torch.Tensor] = []
    if distributed:
        world = dist.get_world_size() // (pipeline.size if pipeline is not None else 1)
        by_weight: dict[tuple[int, torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        reduced = [  # unreduced sums (Partial placements) are reduced first
            g.redistribute(placements=[Replicate() if p.is_partial() else p for p in g.placements])
            if any(p.is_partial() for p in g.placements)
            else g
            for g in pieces
        ]
        for grad, local in zip(reduced, local_pieces(reduced), strict=True):
            by_weight[(_copies(grad, world), local.device, local.dtype)].append(local)
        reduce_device = communication_device(device)
        # Each group's share of the norm: its pieces' norms (one foreach call, as torch's clip_grad_norm_),
        # stacked and converted once; the max for the inf-norm, else the sum of |piece|^p over the copies.
        shares = []
        for (copies, _, _), locals_ in by_weight.items():
            local_norms = torch.stack(torch._foreach_norm(locals_, norm_type)).to(reduce_device, torch.float32)
            if math.isinf(norm_type):
                shares.append(local_norms.amax())
            else:
                share = local_norms.pow(norm_type).sum()
                shares.append(share / copies if copies != 1 else share)  # x / 1 == x: no division
        # A process without pieces still joins the all-reduce, with a zero.
        value = shares[0] if shares else torch.zeros((), dtype=torch.float32, device=reduce_device)
        for share in shares[1:]:
            value = torch.maximum(value, share) if math.isinf(norm_type) else value + share
        if math.isinf(norm_type):
            dist.all_reduce(value, op=dist.ReduceOp.MAX)
        else:
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value = value.pow(1.0 / norm_type)
        norms.append(value.to(device))
    elif pieces:
        plain = plain + local_pieces(pieces)  # no process group: a DTensor of one process is its local tensor
    pipelined = pipeline is not None and pipeline.size > 1
    if plain or pipelined:
        value = (
            torch.nn.utils.get_total_norm(plain, norm_type).to(device=device, dtype=torch.float32)
            if plain
            else torch.zeros((), dtype=torch.float32, device=device)
        )
        if pipeline is not None and pipelined:
            value = _across_stages(value, norm_type, pipeline, device)
        norms.append(value)
    if not norms:
        return torch.tensor(0.0, device=device)
    return torch.linalg.vector_norm(torch.stack(norms), norm_type)


def _across_stages(value: torch.Tensor, norm_type: float, pipeline: MeshGroup, device: torch.device) -> torch.Tensor:
    """The norm over every pipeline stage from each stage's own norm ``value``."""
    reduced = value.to(communication_device(device))
    if math.isinf(norm_type):
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=pipeline.group)
        return reduced.to(device)
    reduced = reduced.pow(norm_type)
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=pipeline.group)
    return reduced.pow(1.0 / norm_type).to(device)


def clip_grad_norm_(
    parameters: Sequence[torch.nn.Parameter],
    max_norm: float,
    norm_type: float = 2.0,
    pipeline: MeshGroup | None = None,
) -> torch.Tensor:
    """Scales the gradients so that their global norm is at most ``max_norm``; returns the norm before clipping.

    pipeline: the ``pp`` group when the model is split into pipeline stages (see ``total_norm``)."""
    parameters = list(parameters)
    norm = total_norm(parameters, norm_type, pipeline)
    clip_to_norm_(parameters, norm, max_norm)
    return norm


def clip_to_norm_(parameters: Sequence[torch.nn.Parameter], norm: torch.Tensor, max_norm: float) -> None:
    """Scales the gradients of ``parameters`` in place by ``min(1, max_norm / norm)``.

    ``norm``: the gradients' global norm, computed as the layout needs (``total_norm`` here, the
    tensor-parallel group's in accel-megatron). One foreach call per device and dtype, on the local
    pieces of DTensor gradients (no DTensor dispatch).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    coefficient = torch.clamp(float(max_norm) / (norm + 1e-6), max=1.0)
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for local in local_pieces(grads):
        groups[(local.device, local.dtype)].append(local)
    with torch.no_grad():
        for (device, dtype), tensors in groups.items():
            # torch's own clip_grad_norm_ scales with it; there is no public in-place foreach multiply.
            torch._foreach_mul_(tensors, coefficient.to(device=device, dtype=dtype))
