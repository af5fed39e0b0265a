"""Errors raised by accel-checkpoint. All are ``ValueError`` subclasses so user code catching the
reference implementation's errors keeps working; each message says which file and what to do."""

from __future__ import annotations

import errno


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


class CheckpointWriteError(CheckpointError, OSError):
    """The file system refused to hold a checkpoint (read-only, no permission, no space, file too large).

    Also an ``OSError``, whose ``errno`` is the file system's reason.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def write_error(error: OSError, target: str) -> CheckpointWriteError:
    """``error`` (raised while writing the checkpoint ``target``, maybe on a hidden temporary path) as one
    ``CheckpointWriteError`` naming ``target``, the reason and what to do."""
    code = error.errno
    reason = error.strerror or str(error)
    name = errno.errorcode.get(code, "") if code is not None else ""
    if code in _FULL:
        fix = (
            "Free space on that file system (ProjectConfiguration(total_limit=...) keeps fewer checkpoints), "
            "or save elsewhere."
        )
    elif code in _DENIED:
        fix = (
            "Save into a folder this process can write (save_state(output_dir) or "
            "ProjectConfiguration(project_dir=...))."
        )
    elif code in (errno.ENOTDIR, errno.EEXIST):
        fix = "A file is in the way of the folder: give save_state a folder path."
    else:
        fix = "Check that the folder can be written, or save elsewhere."
    result = CheckpointWriteError(
        f"Cannot write the checkpoint {target}: {reason}{f' ({name})' if name else ''}. {fix}"
    )
    result.errno = code
    result.__cause__ = error  # the original, with the temporary path, for a traceback
    return result
