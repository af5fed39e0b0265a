"""Where checkpoints live and which ones count: automatic names, completion, latest, total_limit.

A checkpoint folder counts only once it holds the ``COMPLETE`` marker; folders being written are
hidden siblings (``.checkpoint_3.partial-1a2b3c4d``) that are never taken for a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from typing import Any

from .constants import (
    CHECKPOINT_PREFIX,
    CHECKPOINTS_DIR,
    COMPLETE_NAME,
    FORMAT_NAME,
    FORMAT_VERSION,
    LEGACY_RNG_EXT,
    METADATA_NAME,
    OLD_TAG,
    PARTIAL_TAG,
    RNG_STATE_NAME,
)
from .errors import CheckpointFormatError, CorruptCheckpointError
from .fsio import remove_tree

logger = logging.getLogger(__name__)

_NUMBERED = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


@dataclass(frozen=True)
class Found:
    number: int
    path: str
    complete: bool


def checkpoints_dir(project_dir: str) -> str:
    return os.path.join(project_dir, CHECKPOINTS_DIR)


def numbered_path(project_dir: str, number: int) -> str:
    return os.path.join(checkpoints_dir(project_dir), f"{CHECKPOINT_PREFIX}{number}")


def is_complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, COMPLETE_NAME))


def written_by_reference(folder: str) -> bool:
    """Whether ``folder`` is a checkpoint the reference implementation (Hugging Face Accelerate) wrote.

    It writes no ``COMPLETE`` marker and no accel metadata; its RNG states (``random_states_<rank>.pkl``) come
    last of the files its ``save_state`` writes for the prepared objects, so their presence stands for a finished
    save. A run moved from Accelerate to accel resumes from them with ``load_state()`` and prunes them by
    ``total_limit`` as Accelerate would.
    """
    if os.path.isfile(os.path.join(folder, METADATA_NAME)):
        return False
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(name.startswith(f"{RNG_STATE_NAME}_") and name.endswith(LEGACY_RNG_EXT) for name in names)


def number_of(folder: str) -> int | None:
    match = _NUMBERED.match(os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def list_checkpoints(base: str) -> list[Found]:
    """Every ``checkpoint_<n>`` folder in ``base``, oldest first (numbers compared as integers)."""
    if not os.path.isdir(base):
        return []
    found = []
    for name in os.listdir(base):
        number = number_of(name)
        path = os.path.join(base, name)
        if number is not None and os.path.isdir(path):
            found.append(Found(number, path, is_complete(path) or written_by_reference(path)))
    return sorted(found, key=lambda f: f.number)


def latest_complete(base: str) -> Found | None:
    """The newest finished checkpoint; unfinished folders are skipped (and reported)."""
    found = list_checkpoints(base)
    complete = [f for f in found if f.complete]
    newest = complete[-1].number if complete else -1
    skipped = [f.path for f in found if not f.complete and f.number > newest]
    if skipped:
        logger.warning(
            "Skipping checkpoint folders without a %s marker (interrupted saves): %s", COMPLETE_NAME, skipped
        )
    return complete[-1] if complete else None


def partial_path(final: str, tag: str) -> str:
    parent, name = os.path.split(os.path.normpath(final))
    return os.path.join(parent, f".{name}{PARTIAL_TAG}{tag}")


def old_path(final: str, tag: str) -> str:
    parent, name = os.path.split(os.path.normpath(final))
    return os.path.join(parent, f".{name}{OLD_TAG}{tag}")


def remove_leftovers(
    parent: str, keep: str | None = None, only_for: str | None = None, keep_tag: str | None = None
) -> list[str]:
    """Deletes hidden ``.partial-`` / ``.old-`` folders left by interrupted saves.

    only_for: limit to leftovers of one final folder name (explicit output dirs share a parent with
    unrelated things); ``None`` cleans every leftover (the automatic checkpoints folder is ours).
    keep_tag: the token of the save in progress: its folders (written by other processes, maybe
    under another path to the same place) are not leftovers.
    """
    removed = []
    if not os.path.isdir(parent):
        return removed
    for name in os.listdir(parent):
        if not name.startswith("."):
            continue
        stem = name[1:].split(PARTIAL_TAG)[0].split(OLD_TAG)[0]
        if stem == name[1:] or (only_for is not None and stem != only_for):
            continue
        if keep_tag is not None and name.endswith(f"{PARTIAL_TAG}{keep_tag}"):
            continue
        path = os.path.join(parent, name)
        if keep is not None and os.path.abspath(path) == os.path.abspath(keep):
            continue
        remove_tree(path)
        removed.append(path)
    return removed


def prune(base: str, total_limit: int) -> list[str]:
    """Keeps the newest ``total_limit`` finished checkpoints of ``base``, deletes the older ones."""
    complete = [f for f in list_checkpoints(base) if f.complete]
    doomed = complete[: max(0, len(complete) - total_limit)]
    for found in doomed:
        remove_tree(found.path)
    if doomed:
        logger.info("total_limit=%d: deleted %s", total_limit, [f.path for f in doomed])
    return [f.path for f in doomed]


def read_metadata(folder: str) -> dict[str, Any] | None:
    path = os.path.join(folder, METADATA_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            metadata = json.load(handle)
    except (OSError, ValueError) as error:
        raise CorruptCheckpointError(
            f"{path} is truncated or corrupt ({error}). Restore it from a copy or load an earlier checkpoint."
        ) from error
    check_format(metadata, path)
    return metadata


def _installed_version() -> str | None:
    try:
        return importlib_metadata.version("accel-checkpoint")
    except importlib_metadata.PackageNotFoundError:
        return None


def check_format(metadata: Any, path: str) -> None:
    """Refuses metadata of a format (or format version) this accel-checkpoint cannot read, naming both versions.

    ``format_version`` is the reading contract: a writer bumps it when a reader of the previous version would
    misread the folder. A newer accel-checkpoint writing the same format version loads (with a warning naming the
    versions, since a newer writer may hold what this one ignores). Reference-layout checkpoints (Accelerate's,
    no metadata file) never come here.
    """
    installed = _installed_version() or "unknown"
    reads = f"this accel-checkpoint ({installed}) reads {FORMAT_NAME} format version {FORMAT_VERSION}"
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
        found = metadata.get("format") if isinstance(metadata, dict) else type(metadata).__name__
        raise CheckpointFormatError(
            f"{path} is not accel-checkpoint metadata: its format is {found!r}, not {FORMAT_NAME!r} ({reads}). "
            f"Load a folder that save_state() wrote, or remove the foreign {METADATA_NAME} if the folder is an "
            "Accelerate checkpoint (those load without it)."
        )
    version = metadata.get("format_version")
    writer = (metadata.get("versions") or {}).get("accel-checkpoint")
    by = f" by accel-checkpoint {writer}" if writer else ""
    if type(version) is not int:
        raise CheckpointFormatError(
            f"{path} has no valid format_version ({version!r}): {reads}, and accel-checkpoint has written it in "
            "every checkpoint since its first. The file was edited or written by another tool: restore it from a "
            "copy or load an earlier checkpoint."
        )
    if version > FORMAT_VERSION:
        raise CheckpointFormatError(
            f"{path} was written in format version {version}{by}, newer than {reads}. "
            "Upgrade accel (pip install -U accel) to load it."
        )
    if version < 1:
        raise CheckpointFormatError(
            f"{path} has format version {version}{by}, which no accel-checkpoint wrote ({reads}, the first). "
            "The file was edited or written by another tool: restore it from a copy or load an earlier checkpoint."
        )
    if writer and installed != "unknown" and _newer(writer, installed):
        logger.warning(
            "%s was written by accel-checkpoint %s, newer than this one (%s); its format version %d is one this "
            "version reads, so it loads, but anything the newer writer added is ignored. Upgrade accel to read it all.",
            path,
            writer,
            installed,
            version,
        )


def _newer(writer: str, installed: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(writer) > Version(installed)
    except InvalidVersion:
        return False
