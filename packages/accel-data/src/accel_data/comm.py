"""The process group a loader shards over, and the few collectives accel-data needs on it.

accel-data talks to torch.distributed directly (not through accel-core's ops) because it must
work on any group — the data-parallel group of a model-parallel run is not the world — and
because the dispatcher's wire format is its own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class Comm:
    """A process group seen from one of its members: size, rank, source rank and buffer device."""

    def __init__(self, group: Any | None = None) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # Collectives name ranks globally: the group's first member is process 0 of the data.
        self.src = 0 if group is None else dist.get_global_rank(group, 0)
        backend = str(dist.get_backend(group)).lower()
        if "nccl" in backend:
            self.device = torch.device("cuda", torch.cuda.current_device())
        elif "xccl" in backend:
            self.device = torch.device("xpu", torch.xpu.current_device())
        else:
            self.device = torch.device("cpu")

    @property
    def is_source(self) -> bool:
        return self.rank == 0

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """In place from the group's first process; returns ``tensor`` (moved to the buffer device)."""
        buf = tensor if tensor.device == self.device else tensor.to(self.device)
        dist.broadcast(buf, src=self.src, group=self.group)
        return buf

    def scatter(self, output: torch.Tensor, inputs: list[torch.Tensor] | None) -> None:
        """Each process gets ``inputs[rank]`` (given on the first process only) into ``output``."""
        dist.scatter(output, scatter_list=inputs, src=self.src, group=self.group)


def resolve_comm(group: Any | None, num_processes: int) -> Comm | None:
    """The group to talk on when one exists and matches ``num_processes``, else ``None``.

    Without a process group (a single process simulating ``process_index`` of ``num_processes``,
    as in unit tests or a framework that shards by itself) nothing is synchronised.
    """
    if num_processes <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    comm = Comm(group)
    return comm if comm.size == num_processes else None
