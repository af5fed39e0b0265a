"""Errors raised by accel-checkpoint. All are ``ValueError`` subclasses so user code catching the
reference implementation's errors keeps working; each message says which file and what to do."""

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
