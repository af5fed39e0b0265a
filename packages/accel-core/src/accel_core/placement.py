"""Where a process sits and how it talks, when a backend runtime (not torchrun's environment) says so.

Most strategies leave ``PartialState`` to read torchrun's ``RANK`` / ``WORLD_SIZE`` and join a
torch.distributed group. A backend with its own runtime (XLA's PJRT) knows the process's ordinal,
the replica count and its device itself, and moves tensors between processes with its own
collectives. Such a strategy returns a ``ProcessPlacement`` from ``Strategy.setup_environment``; the Accelerator
hands its ``ProcessPlacement`` to the process state, and ``accel_core.ops`` sends gathers, reduces
and broadcasts through its ``Collectives``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Collectives(Protocol):
    """A backend's collectives over all processes, used by ``accel_core.ops`` instead of torch.distributed.

    Every method is called on every process; on one process each still runs (the backend's
    operation over one replica), so a single-process run exercises the same code.
    """

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's ``tensor`` (same shape everywhere) concatenated on dimension 0, in process order."""
        ...

    def all_reduce(self, tensor: torch.Tensor, reduction: str) -> torch.Tensor:
        """A new tensor: ``reduction`` ("sum", "max", "min" or "product") of every process's ``tensor``."""
        ...

    def broadcast(self, tensor: torch.Tensor, from_process: int) -> torch.Tensor:
        """``from_process``'s ``tensor`` on every process (the result may be a new tensor)."""
        ...

    def gather_object(self, obj: Any) -> list[Any]:
        """One picklable object per process, in process order."""
        ...

    def broadcast_object(self, obj: Any, from_process: int) -> Any:
        """``from_process``'s picklable object, on every process."""
        ...

    def barrier(self, tag: str) -> None:
        """Blocks until every process reached a barrier with the same ``tag``."""
        ...


@dataclass(frozen=True)
class ProcessPlacement:
    """This process's place in the job as a backend runtime reports it.

    backend: the name ``PartialState.backend`` reports (``"xla"``).
    collectives: how ``accel_core.ops`` moves tensors between processes; None keeps torch.distributed.

    Example::

        ProcessPlacement(device=torch.device("xla", 0), world_size=1, rank=0, local_rank=0,
                         local_world_size=1, backend="xla", collectives=XlaCollectives())
    """

    device: torch.device
    world_size: int
    rank: int
    local_rank: int
    local_world_size: int
    backend: str | None = None
    collectives: Collectives | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"ProcessPlacement: rank {self.rank} is not within world_size {self.world_size}.")
        if not 0 <= self.local_rank < max(self.local_world_size, 1):
            raise ValueError(
                f"ProcessPlacement: local_rank {self.local_rank} is not within local_world_size "
                f"{self.local_world_size}."
            )
