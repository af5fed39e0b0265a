"""What this package hands a strategy's ``save_sharded`` / ``load_sharded``: accel-core's ``CheckpointIO``.

A backend that saves its own shards reads and writes them through this object (keyword ``io``) rather than
importing accel-checkpoint, so its files get this package's safe loading, its agreement between processes
and its durable writes while depending on accel-core alone.
"""

from __future__ import annotations

from typing import Any

from .coordination import Coordinator
from .fsio import token, write_json
from .layout import partial_path
from .safe_load import load_torch_file, unsafe_pickle_allowed


class SafeCheckpointIO:
    """``accel_core.checkpointing.CheckpointIO`` for one save or load.

    coordinator: the save's or load's own ``Coordinator`` (created on the main thread).
    allow_unsafe_pickle: the ``load_state`` argument as given (None: ``ACCEL_ALLOW_UNSAFE_PICKLE`` decides);
    resolved once, so every file of the load is read under the same answer.
    """

    def __init__(self, coordinator: Coordinator, allow_unsafe_pickle: bool | None = None) -> None:
        self.coordinator = coordinator
        self.allow_unsafe_pickle = unsafe_pickle_allowed(allow_unsafe_pickle)

    def load_torch_file(self, path: str) -> Any:
        return load_torch_file(path, self.allow_unsafe_pickle)

    def load_dcp(self, state_dict: dict[str, Any], path: str) -> None:
        import torch.distributed.checkpoint as dcp

        from .dcp_safe import SafeFileSystemReader, SafeLoadPlanner

        dcp.load(
            state_dict,
            storage_reader=SafeFileSystemReader(path, self.allow_unsafe_pickle),
            planner=SafeLoadPlanner(self.allow_unsafe_pickle),
        )

    def write_json(self, path: str, obj: Any) -> None:
        write_json(path, obj)

    def partial_path(self, final: str) -> str:
        return partial_path(final, token())
