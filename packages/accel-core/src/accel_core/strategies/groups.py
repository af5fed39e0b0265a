"""Process-group helpers that several strategies share."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import environment as env


def join_group_of_one(**kwargs: Any) -> None:
    """With one process and no group yet, joins a process group of one (in memory); otherwise nothing.

    For strategies whose libraries need a group even alone (``fully_shard``, DeviceMesh, DCP,
    Megatron's parallel_state): a lone ``python train.py`` then runs, and a checkpoint written by
    many processes loads the same way on one. With several processes, PartialState joins
    torchrun's group as usual. ``backend`` / ``timeout`` in ``kwargs`` override the defaults.
    """
    if dist.is_initialized() or (env.get_int(env.WORLD_SIZE, 1) or 1) > 1:
        return
    backend = kwargs.get("backend") or ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    timeout = kwargs.get("timeout") or timedelta(minutes=30)
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
