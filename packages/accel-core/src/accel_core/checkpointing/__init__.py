"""The checkpoint contract between accel-checkpoint and the strategies that save their own state.

``contract``: ``ShardedCheckpointing`` (what such a strategy implements), ``CheckpointIO`` and
``Coordination`` (what accel-checkpoint hands it with each call), and the categories a save may cover.
``errors``: the error types both sides raise. A backend imports these from accel-core, never from
accel-checkpoint (every distribution depends on accel-core alone). No torch at run time.
"""

from __future__ import annotations

from .contract import MODELS, OPTIMIZERS, SCHEDULERS, CheckpointIO, Coordination, ShardedCheckpointing
from .errors import (
    CheckpointError,
    CheckpointFormatError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    UnsafeCheckpointError,
)

__all__ = [
    "MODELS",
    "OPTIMIZERS",
    "SCHEDULERS",
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointIO",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "Coordination",
    "CorruptCheckpointError",
    "IncompleteCheckpointError",
    "ShardedCheckpointing",
    "UnsafeCheckpointError",
]
