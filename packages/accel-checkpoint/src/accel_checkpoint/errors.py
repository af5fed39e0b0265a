"""Errors raised by accel-checkpoint, and the messages for a file system that refuses a checkpoint.

The error classes are declared in accel-core (``accel_core.checkpointing.errors``), where the strategies that
save their own shards raise them too, and are re-exported here: ``except accel_checkpoint.errors.X`` and
``isinstance`` catch both. All are ``ValueError`` subclasses so user code catching the reference
implementation's errors keeps working; each message says which file and what to do."""

from __future__ import annotations

import errno
import os
import shutil

from accel_core.checkpointing.errors import (
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
    "CheckpointError",
    "CheckpointFormatError",
    "CheckpointMismatchError",
    "CheckpointNotFoundError",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "IncompleteCheckpointError",
    "UnsafeCheckpointError",
    "out_of_space",
    "write_error",
]


_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_NO_ROOM = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def write_error(error: OSError, target: str) -> CheckpointWriteError:
    """``error`` (raised while writing the checkpoint ``target``, maybe on a hidden temporary path) as one
    ``CheckpointWriteError`` naming ``target``, the reason and what to do."""
    code = error.errno
    reason = error.strerror or str(error)
    name = errno.errorcode.get(code, "") if code is not None else ""
    if code in _NO_ROOM and _out_of_inodes(_existing_parent(target)):
        reason = "no free inodes: the file system can hold no more files"
        fix = (
            "Delete files there (ProjectConfiguration(total_limit=...) keeps fewer checkpoints), or save on a file "
            "system with free inodes (`df -i` shows them)."
        )
    elif code in _FULL:
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


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _existing_parent(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder


def _out_of_inodes(folder: str) -> bool:
    """Whether the file system holding ``folder`` has no inode left for this user (one that counts them)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    # f_files is 0 where the file system has no inode limit (btrfs, some network file systems).
    return stat.f_files > 0 and (stat.f_favail == 0 or stat.f_ffree == 0)


def out_of_space(
    error: BaseException, folder: str, needed: int, target: str, partial: int = 0
) -> CheckpointWriteError | None:
    """``error`` as "the disk is full" (or "no free inodes") when the file system holding ``folder`` is, else None.

    torch.save into a full disk raises no ``OSError`` but ``RuntimeError: [enforce fail at
    inline_container.cc] unexpected pos ...`` (its zip writer notices the short write, not why): a
    failed write while the file system has less room than the files still to write is taken for a
    full disk. ``needed``: the bytes of the files not yet written, the failed one included.
    """
    code = error.errno if isinstance(error, OSError) else None
    try:
        free: int | None = shutil.disk_usage(folder).free
    except OSError:
        free = None
    no_room = code in _NO_ROOM  # not EFBIG: a file-size limit, where write_error's message fits
    full = no_room or (isinstance(error, RuntimeError) and free is not None and free < needed)
    if not full:
        return None
    if no_room and _out_of_inodes(folder):
        # ENOSPC with bytes to spare: the file system can hold no more files (each file and folder takes an
        # inode, a fixed number of them made with the file system). "The disk is full" would send the user
        # looking for bytes that are there.
        there = f", though {_size(free)} are free" if free is not None else ""
        result = CheckpointWriteError(
            f"Cannot write the checkpoint {target}: the file system of {os.path.dirname(os.path.abspath(target))} "
            f"has no free inodes ({errno.errorcode.get(code or errno.ENOSPC)}: it can hold no more files{there}). "
            "Delete files there (ProjectConfiguration(total_limit=...) keeps fewer checkpoints), or save on a file "
            "system with free inodes (`df -i` shows them). The checkpoints already there are untouched."
        )
        result.errno = code or errno.ENOSPC
        result.__cause__ = error
        return result
    room = f"has {_size(free + partial)} free without this save's partial files" if free is not None else "is full"
    result = CheckpointWriteError(
        f"Cannot write the checkpoint {target}: the disk is full ({errno.errorcode.get(code or errno.ENOSPC)}). "
        f"The file system of {os.path.dirname(os.path.abspath(target))} {room}; the checkpoint's files still to "
        f"write need about {_size(needed)}. Free space on that file system (ProjectConfiguration(total_limit=...) "
        "keeps fewer checkpoints), or save elsewhere. The checkpoints already there are untouched."
    )
    result.errno = code or errno.ENOSPC
    result.__cause__ = error
    return result
