"""The writing half of ``save_state``: files into the hidden folder, marker last, rename into place.

Order on disk, which is what makes a crash at any moment harmless:

1. every process writes its files into ``.<name>.partial-<token>/`` (several at once, each hashed
   as it is written and fsynced, unless ``durable=False``: then a killed process is covered, a power
   cut is not), and the sharded state a strategy handed over (``write_sharded_state``: its
   ``torch.distributed.checkpoint`` folders, collectively) meanwhile;
2. all processes agree that every write succeeded (one failing process fails them all);
3. process 0 (and the first process of each other folder, when processes write to several)
   writes ``accel_checkpoint.json`` (with every file's size) and then ``COMPLETE``, fsyncs the
   folder, and renames it to its final name (an existing folder of that name is moved
   aside first and deleted after);
4. only then are checkpoints beyond ``total_limit`` deleted.

Killed before 3 finishes: only a hidden ``.partial-`` folder exists; it is never taken for a
checkpoint and the next save deletes it. The previous checkpoint is untouched throughout.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import torch

from . import constants as C
from . import layout
from .content_hash import ALGORITHM, hash_files
from .coordination import Coordinator
from .dcp_write import write_sharded_state
from .errors import CheckpointError, out_of_space, write_error
from .file_sink import FileSink, torch_save_without_crc
from .fsio import file_sizes, fsync_dir, fsync_path, remove_tree, token, write_json
from .safetensors_io import write_safetensors, write_safetensors_to
from .save_plan import FileJob, SaveJob

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

_WRITERS = 4  # files written at once: a model's and an optimizer's state fill the page cache side by side


def write_file(job: FileJob, folder: str, durable: bool = True, syncer: ThreadPoolExecutor | None = None) -> FileSink:
    """Writes one file of the checkpoint (fsynced when ``durable``); returns its closed sink (size and digest)."""
    sink = FileSink(os.path.join(folder, job.name), durable, syncer)
    try:
        if job.kind == "safetensors" and sys.byteorder == "little":
            write_safetensors_to(sink, job.payload, job.metadata)
        elif job.kind == "safetensors":  # big-endian: the library converts (hashed when the checkpoint completes)
            sink.abandon()
            write_safetensors(job.payload, sink.path, job.metadata, durable=durable)
            return sink
        else:
            with torch_save_without_crc():
                torch.save(job.payload, sink)  # pyright: ignore[reportArgumentType] - a file-like object
    except BaseException:
        sink.abandon()
        raise
    sink.digest = sink.close()
    return sink


def _tensor_bytes(obj: Any) -> int:
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def write_files(job: SaveJob) -> None:
    """Writes the job's files, several at once (largest first), each hashed as it is written and, unless
    ``job.durable`` is off, fsynced as it goes (``file_sink``)."""
    files = sorted(job.files, key=lambda f: _tensor_bytes(f.payload), reverse=True)
    writers = max(1, min(_WRITERS, os.cpu_count() or 1, len(files)))
    with (
        ThreadPoolExecutor(max_workers=writers, thread_name_prefix="accel-write") as pool,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="accel-fsync") as syncer,
    ):
        futures = []
        if job.durable and job.strategy_wrote:
            # The escape hatch: a backend's library wrote its files during planning, not all with a writer that
            # fsyncs (DeepSpeed's does not): sync them, while our own files are written.
            for root, _dirs, names in os.walk(os.path.join(job.temp_dir, C.SHARDED_DIR)):
                futures += [syncer.submit(fsync_path, os.path.join(root, name)) for name in names]
                futures.append(syncer.submit(fsync_path, root))  # the folder's entries: its files' names
        written = {f.name: pool.submit(write_file, f, job.temp_dir, job.durable, syncer) for f in files}
        if job.sharded is not None:  # the handed-over shards, on this thread: collective, in order
            write_sharded_state(job.sharded, os.path.join(job.temp_dir, C.SHARDED_DIR), job.durable, job.group)
            job.sharded = None  # drop references to the snapshot as soon as it is on disk
        for future in futures:
            future.result()
        for file_job in files:
            try:
                sink = written[file_job.name].result()
            except Exception as error:
                wait(written.values())  # the other files end (or fail) before the folder is measured
                unfinished = [f for f in files if written[f.name].exception() is not None]
                needed = sum(_tensor_bytes(f.payload) for f in unfinished)
                partial = sum(file_sizes(job.temp_dir).values())
                full = out_of_space(error, job.temp_dir, needed, job.final_dir, partial)
                if full is None:
                    raise
                raise full from error
            job.written[file_job.name] = sink.size
            if sink.digest is not None:
                job.hashes[file_job.name] = sink.digest


def _install(temp: str, final: str, replace: bool) -> None:
    """Renames ``temp`` to ``final``; an existing ``final`` is swapped out and then deleted."""
    parent = os.path.dirname(final)
    if os.path.lexists(final):
        if not replace:
            raise CheckpointError(f"{final} appeared while the checkpoint was being written; not overwriting it.")
        aside = layout.old_path(final, token())
        os.rename(final, aside)
        os.rename(temp, final)
        fsync_dir(parent)
        remove_tree(aside)
    else:
        os.rename(temp, final)
        fsync_dir(parent)


def _finish(job: SaveJob) -> None:
    """Metadata, then the marker, then the rename: the marker's presence implies everything else."""
    sizes = file_sizes(job.temp_dir)
    # This process's own files were hashed while written; the others (other processes', a strategy's) are read.
    hashes = {name: job.hashes[name] for name in sizes if name in job.hashes}
    hashes.update(hash_files(job.temp_dir, [name for name in sizes if name not in hashes]))
    metadata = dict(job.metadata, files=sizes, hashes=hashes, hash_algorithm=ALGORITHM)
    write_json(os.path.join(job.temp_dir, C.METADATA_NAME), metadata)
    write_json(os.path.join(job.temp_dir, C.COMPLETE_NAME), {"complete": True, "files": len(metadata["files"]) + 1})
    fsync_dir(job.temp_dir)
    _install(job.temp_dir, job.final_dir, job.replace_existing)
    if job.prune_base is not None and job.total_limit is not None:
        layout.prune(job.prune_base, job.total_limit)


def _named(error: BaseException, job: SaveJob) -> BaseException:
    """A file system's refusal, about a file in the hidden temporary folder, as an error naming the checkpoint."""
    if isinstance(error, OSError) and not isinstance(error, CheckpointError):
        return write_error(error, job.final_dir)
    return error


def run_job(job: SaveJob, coord: Coordinator) -> str:
    """Writes ``job``'s files and, on the finishing process, completes the checkpoint. Collective."""
    error: BaseException | None = None
    try:
        write_files(job)
        job.files = []  # drop references to the snapshot as soon as it is on disk
    except BaseException as caught:  # noqa: BLE001 - reported to every process below
        error = _named(caught, job)
    try:
        coord.agree(error, f"writing checkpoint {job.final_dir}")
    except BaseException:
        if job.finalizer:
            remove_tree(job.temp_dir)
        raise

    # Each folder's leader completes it: process 0's, and those of processes writing elsewhere
    # (another machine's disk, a folder of their own).
    error = None
    if job.finalizer:
        try:
            _finish(job)
        except BaseException as caught:  # noqa: BLE001
            error = _named(caught, job)
    coord.agree(error, f"completing checkpoint {job.final_dir}")
    logger.info("Saved state to %s", job.final_dir)
    return job.final_dir


class PendingSave:
    """An async save in progress; ``wait()`` joins it and re-raises its error, if any."""

    def __init__(self, job: SaveJob, coord: Coordinator, on_done: Any = None) -> None:
        self.final_dir = job.final_dir
        self.error: BaseException | None = None
        self._on_done = on_done
        # Not a daemon: at interpreter exit Python waits for it, so a finished script's last
        # checkpoint is completed rather than abandoned half-written.
        self._thread = threading.Thread(
            target=self._run, args=(job, coord), name="accel-checkpoint-writer", daemon=False
        )
        self._thread.start()

    def _run(self, job: SaveJob, coord: Coordinator) -> None:
        try:
            run_job(job, coord)
        except BaseException as caught:  # noqa: BLE001 - kept for wait()
            self.error = caught
            logger.error("Async checkpoint save to %s failed: %s", self.final_dir, caught)
        finally:
            if self._on_done is not None:
                self._on_done()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> str:
        self._thread.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise CheckpointError(f"The async save to {self.final_dir} failed: {error}") from error
        return self.final_dir
