"""Agreement between processes during a save or load, on a dedicated gloo group.

Why a separate group: an async save finishes on a background thread while the main thread keeps
running DDP collectives on the default group; collectives of two threads on one group would
interleave differently on each rank and deadlock. Gloo also works whatever device the default
group uses, so small Python objects can be exchanged without a CUDA tensor.

Why "agree" instead of a barrier: if one process fails (disk full, missing file), a barrier would
leave the others waiting forever. ``agree`` gathers every process's outcome, and all of them raise.
"""

from __future__ import annotations

from typing import Any

from .errors import CheckpointError


def _world_group() -> Any:
    # accel-core's, which the Accelerator creates at setup (collective): a gloo failure shows at the start.
    from accel_core.strategies.groups import coordination_group

    return coordination_group()


class Coordinator:
    """Collectives for checkpointing; with one process each call is a local no-op.

    Create it on the main thread (group creation is itself a collective), use it from one thread at a time.
    """

    def __init__(self) -> None:
        import torch.distributed as dist

        self.group = _world_group()
        self.rank = dist.get_rank() if self.group is not None else 0
        self.world_size = dist.get_world_size() if self.group is not None else 1

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj``, in rank order, on every process."""
        if self.group is None:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.group is None:
            return obj
        import torch.distributed as dist

        holder = [obj]
        dist.broadcast_object_list(holder, src=src, group=self.group)
        return holder[0]

    def barrier(self) -> None:
        self.gather(None)  # an all-gather is a barrier that works on any gloo build

    def agree(self, error: BaseException | None, what: str) -> None:
        """Raises on every process if ``what`` failed on any: the local error where it happened."""
        outcomes = self.gather(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = [(rank, message) for rank, message in enumerate(outcomes) if message is not None]
        if failed:
            rank, message = failed[0]
            raise CheckpointError(f"{what} failed on process {rank}: {message}")
