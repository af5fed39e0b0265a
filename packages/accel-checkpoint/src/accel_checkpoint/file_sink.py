"""One checkpoint file being written: hashed as its bytes pass, and (durable) on its way to disk while written.

Why hash here: the manifest records each file's digest (``content_hash``). Computing it from the
bytes on their way out costs one pass over memory that is hot anyway; reading the finished files
back to hash them cost a second pass over the whole checkpoint.

Why sync early: an fsync at the end of a large file waits for all of it to reach the disk, while
the CPU sits idle. Every ``EARLY_SYNC_BYTES`` written, a helper thread fsyncs the file so far
(the writer keeps writing meanwhile), and the final fsync waits for the tail only. The crash
guarantees are those of one fsync per file: the file counts only after its final fsync returns.

Why no zip CRC-32 in ``torch.save``: its archive computes a CRC-32 of every record (a third pass
over the bytes, the slowest of the three: it doubled the time of saving AdamW's moments). The
manifest's digest covers the same bytes, and ``torch.load`` reads archives without CRCs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .content_hash import new_digest

EARLY_SYNC_BYTES = 64 * 2**20


class FileSink:
    """A new binary file: ``write`` hashes and writes; ``close`` (fsyncs when durable and) returns the digest.

    ``syncer``: the thread that runs the early fsyncs (None: no early fsync, only the final one).
    """

    def __init__(self, path: str, durable: bool, syncer: ThreadPoolExecutor | None = None) -> None:
        self.path = path
        self.size = 0
        self.digest: str | None = None  # set by the writer once closed
        self._durable = durable
        self._syncer = syncer if durable else None
        self._digest = new_digest()
        self._pending: Future[None] | None = None
        self._unsynced = 0
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
        if self._syncer is not None and self._unsynced >= EARLY_SYNC_BYTES and not self._syncing():
            self._pending = self._syncer.submit(os.fsync, self._file.fileno())
            self._unsynced = 0
        return done

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
        """Waits for the early fsync, fsyncs the rest (durable), closes; returns the hex digest."""
        try:
            if self._pending is not None:
                self._pending.result()
            if self._durable:
                os.fsync(self._file.fileno())
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
