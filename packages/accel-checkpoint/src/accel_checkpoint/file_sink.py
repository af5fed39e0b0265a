"""One checkpoint file being written: hashed as its bytes pass, and (durable) on its way to disk while written.

Why hash here: the manifest records each file's digest (``content_hash``). Computing it from the
bytes on their way out costs one pass over memory that is hot anyway; reading the finished files
back to hash them cost a second pass over the whole checkpoint.

Why sync early: an fsync at the end of a large file waits for all of it to reach the disk, while
the CPU sits idle. On Linux, every ``EARLY_WRITEBACK_BYTES`` written, ``sync_file_range`` asks the
kernel to start writing those bytes out (it does not wait for them, and commits no journal), so the
disk works while the writer keeps writing and the final sync waits for the tail only. Elsewhere (or
where the file system refuses it), a helper thread fsyncs the file so far every ``EARLY_SYNC_BYTES``
instead. The final sync is ``fdatasync`` where there is one: it writes the data and what is needed to
read it back (size, block map), not the timestamps; the file's name is made durable by the fsync of
its folder before the checkpoint is renamed into place (``writer``). The crash guarantees are those
of one fsync per file: the file counts only after its final sync returns.

Why no zip CRC-32 in ``torch.save``: its archive computes a CRC-32 of every record (a third pass
over the bytes, the slowest of the three: it doubled the time of saving AdamW's moments). The
manifest's digest covers the same bytes, and ``torch.load`` reads archives without CRCs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .content_hash import new_digest

EARLY_SYNC_BYTES = 64 * 2**20  # the fallback's early fsyncs (each commits the file system's journal)
EARLY_WRITEBACK_BYTES = 8 * 2**20  # writeback started this often on Linux (cheap: no wait, no journal)
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait


def final_sync(fd: int) -> None:
    """``fdatasync`` where there is one (data + the metadata needed to read it back; no timestamps), else fsync."""
    getattr(os, "fdatasync", os.fsync)(fd)  # looked up per call: a test's spy on os sees it


def _load_sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


class FileSink:
    """A new binary file: ``write`` hashes and writes; ``close`` (syncs when durable and) returns the digest.

    ``syncer``: the thread that runs the fallback's early fsyncs (None: none, only the final sync).
    """

    def __init__(self, path: str, durable: bool, syncer: ThreadPoolExecutor | None = None) -> None:
        self.path = path
        self.size = 0
        self.digest: str | None = None  # set by the writer once closed
        self._durable = durable
        self._syncer = syncer if durable else None
        self._writeback = _sync_file_range if durable else None
        self._digest = new_digest()
        self._pending: Future[None] | None = None
        self._unsynced = 0  # bytes written since the last early sync (or writeback start): from self.size - this
        self._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by close(), also on errors

    def write(self, data: Any) -> int:
        """Writes ``data`` (bytes, or any buffer: torch.save hands memoryviews of its records)."""
        view = memoryview(data).cast("B")
        self._digest.update(view)
        done = 0
        while done < len(view):  # an unbuffered file may take fewer bytes than offered
            done += self._file.write(view[done:]) or 0
        self.size += done
        self._unsynced += done
        if self._writeback is not None:
            if self._unsynced >= EARLY_WRITEBACK_BYTES:
                self._start_writeback()
        elif self._syncer is not None and self._unsynced >= EARLY_SYNC_BYTES and not self._syncing():
            self._pending = self._syncer.submit(final_sync, self._file.fileno())
            self._unsynced = 0
        return done

    def _start_writeback(self) -> None:
        """The kernel starts writing the bytes not yet sent to the disk; a refusal switches to early fsyncs."""
        assert self._writeback is not None
        offset = self.size - self._unsynced
        if self._writeback(self._file.fileno(), offset, self._unsynced, _SYNC_FILE_RANGE_WRITE) == 0:
            self._unsynced = 0
        else:  # e.g. a file system without it: the final sync still covers everything
            self._writeback = None

    def _syncing(self) -> bool:
        """Whether the last early fsync still runs (the error of a finished one is raised here)."""
        if self._pending is None:
            return False
        if not self._pending.done():
            return True
        self._pending.result()
        return False

    def flush(self) -> None:
        """Nothing is buffered (torch.save calls it at the end of its archive)."""

    def close(self) -> str:
        """Waits for the early fsync, syncs the rest (durable), closes; returns the hex digest."""
        try:
            if self._pending is not None:
                self._pending.result()
            if self._durable:
                final_sync(self._file.fileno())
        finally:
            self._file.close()
        return self._digest.hexdigest()

    def abandon(self) -> None:
        """Closes after a failed write (waiting for an early fsync that still uses the descriptor)."""
        with contextlib.suppress(BaseException):
            if self._pending is not None:
                self._pending.result()
        self._file.close()


_crc_lock = threading.Lock()
_crc_users = 0
_crc_before = True


@contextlib.contextmanager
def torch_save_without_crc() -> Iterator[None]:
    """``torch.save`` writes no zip CRC-32 inside the block (the switch is process-wide in torch, so nested and
    concurrent blocks share it: it is restored when the last one ends)."""
    import torch.serialization

    global _crc_users, _crc_before
    with _crc_lock:
        if _crc_users == 0:
            _crc_before = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
        _crc_users += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_users -= 1
            if _crc_users == 0:
                torch.serialization.set_crc32_options(_crc_before)
