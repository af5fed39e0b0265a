"""Durable file writing: every file is flushed and fsynced, folders appear by an atomic rename.

Why fsync and not only rename: after a power cut (not just a killed process) a renamed folder whose
files were still in the page cache could hold empty files. fsync of the files, then of the folder
that holds the new name, makes "the folder exists" imply "its content is on disk".
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from typing import IO, Any


def token() -> str:
    """A short random name part. Uses os.urandom, so it never touches the RNGs a checkpoint saves."""
    return secrets.token_hex(4)


def fsync_wanted(explicit: bool | None = None) -> bool:
    """Whether checkpoint files are fsynced: the argument wins, else ``ACCEL_CHECKPOINT_FSYNC`` (default on)."""
    if explicit is not None:
        return bool(explicit)
    from accel_core.environment import parse_flag

    from .constants import FSYNC_ENV

    value = os.environ.get(FSYNC_ENV, "").strip()
    try:
        return parse_flag(value) if value else True  # empty counts as unset here, not as "off"
    except ValueError:
        raise ValueError(
            f"{FSYNC_ENV}={os.environ[FSYNC_ENV]!r} is not a switch; set it to 1 (fsync, the default) or 0."
        ) from None


def fsync_dir(path: str) -> None:
    """Persists the entries (new names) of a folder. A no-op where folders cannot be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on folders; the rename is still atomic there
    finally:
        os.close(fd)


@contextlib.contextmanager
def durable_open(path: str, mode: str = "wb", durable: bool = True) -> Iterator[IO[Any]]:
    """``open`` whose file is flushed and (when ``durable``) fsynced before the block is left."""
    with open(path, mode) as handle:
        yield handle
        handle.flush()
        if durable:
            os.fsync(handle.fileno())


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torch_save(obj: Any, path: str, durable: bool = True) -> int:
    """``torch.save`` to ``path`` (fsynced when ``durable``); returns the size written."""
    import torch

    with durable_open(path, durable=durable) as handle:
        torch.save(obj, handle)
    return os.path.getsize(path)


def write_json(path: str, obj: Any) -> int:
    with durable_open(path, "w") as handle:
        json.dump(obj, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return os.path.getsize(path)


def replace_file_atomically(write: Any, path: str) -> int:
    """Calls ``write(tmp_path)`` then renames the temporary file onto ``path``.

    Readers see the old file or the new one, never a half-written one.
    """
    folder, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{name}.tmp-{token()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(folder)
    return os.path.getsize(path)


def remove_tree(path: str) -> None:
    """Deletes a folder; a folder already gone is not an error (another process may have won)."""
    shutil.rmtree(path, ignore_errors=True)


def file_sizes(folder: str) -> dict[str, int]:
    """Relative path -> size of every file under ``folder``."""
    sizes: dict[str, int] = {}
    for root, _dirs, files in os.walk(folder):
        for name in files:
            full = os.path.join(root, name)
            sizes[os.path.relpath(full, folder).replace(os.sep, "/")] = os.path.getsize(full)
    return sizes
