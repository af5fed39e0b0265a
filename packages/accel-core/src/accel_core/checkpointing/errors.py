"""The checkpoint error types: raised by accel-checkpoint and by the strategies that save and load their own shards.

They are declared here, in accel-core, so that a backend raises the same classes as accel-checkpoint without
importing it (``accel_checkpoint.errors`` re-exports them: ``except accel_checkpoint.errors.X`` keeps working).
All are ``ValueError`` subclasses, so user code catching the reference implementation's errors keeps working;
each message says which file and what to do. No torch here.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """Base class: a checkpoint cannot be written or read as asked."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The folder (or a file it must contain) does not exist."""


class IncompleteCheckpointError(CheckpointError):
    """The folder has no completion marker: its save was interrupted."""


class CorruptCheckpointError(CheckpointError):
    """A file exists but is truncated or unreadable."""


class UnsafeCheckpointError(CheckpointError):
    """A file needs arbitrary unpickling (it could run code) and the opt-in was not given."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint holds a different number of models/optimizers/... than was prepared."""


class CheckpointFormatError(CheckpointMismatchError):
    """The checkpoint is in a format (or format version) this version of accel-checkpoint cannot read."""


class CheckpointWriteError(CheckpointError, OSError):
    """The file system refused to hold a checkpoint (read-only, no permission, no space, file too large).

    Also an ``OSError``, whose ``errno`` is the file system's reason.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


__all__ = [
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "IncompleteCheckpointError",
    "UnsafeCheckpointError",
]
