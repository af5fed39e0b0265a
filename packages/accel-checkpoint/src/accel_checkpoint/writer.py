"""The writing half of ``save_state``: files into the hidden folder, marker last, rename into place.

Order on disk, which is what makes a crash at any moment harmless:

1. every process writes its files into ``.<name>.partial-<token>/`` (each file fsynced, unless
   ``durable=False``: then a killed process is covered, a power cut is not);
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
import threading
from typing import Any

from . import constants as C
from . import layout
from .content_hash import ALGORITHM, hash_files
from .coordination import Coordinator
from .errors import CheckpointError, out_of_space, write_error
from .fsio import BackgroundSync, file_sizes, fsync_dir, remove_tree, token, torch_save, write_json
from .safetensors_io import write_safetensors
from .save_plan import FileJob, SaveJob

logger = logging.getLogger(__name__)


def write_file(job: FileJob, folder: str, durable: bool = True) -> int:
    path = os.path.join(folder, job.name)
    if job.kind == "safetensors":
        return write_safetensors(job.payload, path, job.metadata, durable=durable)
    return torch_save(job.payload, path, durable=durable)


def _tensor_bytes(obj: Any) -> int:
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def write_files(job: SaveJob) -> None:
    """Writes the job's files, largest first, each fsynced on a helper thread while the next is written
    (unless ``job.durable`` is off)."""
    syncer = BackgroundSync()
    try:
        if job.durable:
            # A strategy's shards are already written (during planning), not all by a writer that
            # fsyncs (DeepSpeed's does not): sync them too, while our own files are written.
            for root, _dirs, names in os.walk(os.path.join(job.temp_dir, C.SHARDED_DIR)):
                for name in names:
                    syncer.submit(os.path.join(root, name))
                syncer.submit(root)  # the folder's entries: its files' names
        ordered = sorted(job.files, key=lambda f: _tensor_bytes(f.payload), reverse=True)
        for index, file_job in enumerate(ordered):
            try:
                job.written[file_job.name] = write_file(file_job, job.temp_dir, durable=False)
            except Exception as error:
                needed = sum(_tensor_bytes(f.payload) for f in ordered[index:])
                partial = sum(file_sizes(job.temp_dir).values())
                full = out_of_space(error, job.temp_dir, needed, job.final_dir, partial)
                if full is None:
                    raise
                raise full from error
            if job.durable:
                syncer.submit(os.path.join(job.temp_dir, file_job.name))
    finally:
        syncer.wait()


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
    metadata = dict(job.metadata, files=sizes, hashes=hash_files(job.temp_dir, sizes), hash_algorithm=ALGORITHM)
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
