"""Process-group helpers that several strategies share."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from ..state.process_state import group_timeout


def join_group_of_one(world_size: int, **kwargs: Any) -> None:
    """With one process and no group yet, joins a process group of one (in memory); otherwise nothing.

    For strategies whose libraries need a group even alone (``fully_shard``, DeviceMesh, DCP,
    Megatron's parallel_state): a lone ``python train.py`` then runs, and a checkpoint written by
    many processes loads the same way on one. With several processes (``world_size``, the settled record's),
    PartialState joins the job's group as usual. ``backend`` / ``timeout`` in ``kwargs`` override the defaults.
    """
    if dist.is_initialized() or world_size > 1:
        return
    backend = kwargs.get("backend") or ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    timeout = kwargs.get("timeout") or timedelta(minutes=30)
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)


_COORDINATION: dict[str, Any] = {}


def coordination_group() -> dist.ProcessGroup | None:
    """The job's gloo group for agreement between hosts (accel-checkpoint's coordinator); None with one process.

    Created once per default group, collectively. The Accelerator creates it while it sets up (every process at the
    same point), not at the first save hours later: gloo finds its network interface on its own (or from
    ``GLOO_SOCKET_IFNAME``), NCCL on its own (``NCCL_SOCKET_IFNAME``), so on several machines gloo can fail where NCCL
    works, and it should fail in the first seconds. Gloo because the coordinator exchanges Python objects from a
    background thread (an asynchronous save) whatever device the default group uses.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    world = dist.group.WORLD
    if _COORDINATION.get("world") is not world:  # a new default group (after destroy_process_group): a new one too
        # Every rank is a member; it waits as long as the default group (--collective-timeout), not torch's 30 min.
        group = dist.new_group(backend="gloo", timeout=group_timeout())
        _COORDINATION["group"] = cast("dist.ProcessGroup", group)
        _COORDINATION["world"] = world
    return _COORDINATION["group"]
