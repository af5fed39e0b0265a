"""Writing ``torch.distributed.checkpoint`` (DCP) folders: the sharded state a strategy handed over.

Kept apart from ``writer`` (the whole save job) because a strategy that keeps the escape hatch and delegates
to ``DCPCheckpointing.save_sharded`` writes through it too; ``dcp_safe`` is the reading half.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any

from .fsio import fsync_dir

if TYPE_CHECKING:
    from accel_core.checkpointing import ShardedState


def write_sharded_state(state: ShardedState, folder: str, durable: bool = True, group: Any = None) -> None:
    """Writes the ``torch.distributed.checkpoint`` state dicts a strategy handed over into ``folder``, one DCP folder
    each, fsynced when ``durable``. Collective over ``group`` (None: the default group), in the same order on every
    process. The state's plain ``files`` are written as the job's other files are."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    # One process: no collective at all (not even on a default group of one, which may be NCCL's: this may run on
    # the background thread while training goes on). DCP warns about that on each save; only that warning is hidden.
    alone = not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1
    for name, state_dict in state.dcp.items():
        path = os.path.join(folder, name)
        writer = FileSystemWriter(path, sync_files=durable)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.save(state_dict, storage_writer=writer, process_group=group, no_dist=alone)
        if durable:
            fsync_dir(path)  # the folder's entries: its files' names
