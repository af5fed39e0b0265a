"""Replicas over data parallelism for models tensor parallelism has split (DTensor parameters).

torch's ``DistributedDataParallel`` refuses DTensor parameters, so replicas of a
tensor-parallel model are made with FSDP2 on the 2-D mesh ``(dp_replicate, dp_shard)`` whose
``dp_shard`` has size 1: every replica holds the whole (tensor-parallel) model, and gradients are
averaged over ``dp_replicate`` after backward — DDP's semantics, on the mesh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from ..parallel.dims import ParallelDims


def is_replicated(model: nn.Module) -> bool:
    """Whether ``model`` went through ``replicate`` (or FSDP2's ``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def replicate(model: nn.Module, dims: ParallelDims, blocks: list[nn.Module]) -> nn.Module:
    """Makes ``model`` (with DTensor parameters) a replica over ``dims.dp``; returns the same module object.

    Each block is its own unit (its gradients are averaged while backward goes on), then the root.
    """
    from torch.distributed.fsdp import fully_shard

    if dims.config.size("dp_shard") != 1 or not dims.has("dp_shard"):
        raise ValueError(
            "Replicating a tensor-parallel model needs a mesh with a dp_shard dimension of size 1 "
            f"(this mesh: {dims.names}); let the Accelerator build the mesh from a ParallelismConfig."
        )
    mesh = dims.submesh("dp_replicate", "dp_shard")
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model
