"""``load_state``: find the checkpoint, read every file (safely), then restore the prepared objects.

Reading happens entirely before anything is changed, and all processes agree that their reads
succeeded: a missing or corrupt file on one process fails every process, and leaves the objects
of all of them untouched.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

from . import access, layout
from . import constants as C
from .checkpoint_io import SafeCheckpointIO
from .content_hash import BackgroundVerifier
from .coordination import Coordinator
from .data_state import restore_dataloader_state
from .errors import CheckpointMismatchError, CheckpointNotFoundError, CorruptCheckpointError, IncompleteCheckpointError
from .legacy import legacy_counts
from .optimizer_state import check_optimizer_class, load_optimizer_state, read_optimizer_state
from .rng import restore_legacy_rng_state, restore_rng_state
from .safe_load import load_torch_file
from .safetensors_io import read_safetensors
from .sharded import MODELS, OPTIMIZERS, SCHEDULERS, DCPCheckpointing, find_sharded

if TYPE_CHECKING:
    from accel_core.protocols import CheckpointAccelerator

# Sharded layouts that are plain DCP folders (model_<i>/, optimizer_<i>/), loadable by DCPCheckpointing.
_DCP_LAYOUTS = ("dcp", "accel_fsdp.strategy.FSDPStrategy")

logger = logging.getLogger(__name__)


def _automatic_base(accelerator: CheckpointAccelerator) -> str:
    config = accelerator.project_configuration
    if config is None or not config.automatic_checkpoint_naming or not config.project_dir:
        raise ValueError(
            "load_state() needs input_dir, unless ProjectConfiguration(automatic_checkpoint_naming=True, "
            "project_dir=...) is used, in which case it loads the newest checkpoint."
        )
    return layout.checkpoints_dir(config.project_dir)


def resolve_input_dir(
    accelerator: CheckpointAccelerator, input_dir: str | None, coord: Coordinator | None = None
) -> str:
    """This process's checkpoint folder: ``input_dir``, or the newest automatic checkpoint.

    Each process reads its own folder (processes may each have their own, on their own disk).
    Automatic: the newest number complete in every process's folder, so that all of them load the
    same checkpoint even if a save was interrupted after some processes had completed theirs.
    Collective when ``coord`` is given and ``input_dir`` is None.
    """
    if input_dir is None:
        base = _automatic_base(accelerator)
        complete = {f.number for f in layout.list_checkpoints(base) if f.complete}
        everywhere = set(complete)
        if coord is not None:
            for other in coord.gather(sorted(complete)):
                everywhere &= set(other)
        if not everywhere:
            hint = " on every process" if complete else ""
            raise CheckpointNotFoundError(
                f"No complete checkpoint in {base}{hint}: nothing to resume from (save_state() first)."
            )
        number = max(everywhere)
        if complete and number < max(complete):
            logger.warning(
                "Loading checkpoint_%d: the newer checkpoint_%d in %s is not complete on every process.",
                number,
                max(complete),
                base,
            )
        layout.latest_complete(base)  # reports unfinished folders
        return os.path.abspath(layout.numbered_path(os.path.dirname(base), number))
    folder = os.path.abspath(os.path.expanduser(input_dir))
    if not os.path.isdir(folder):
        hint = ""
        parent, name = os.path.split(folder)
        if os.path.isdir(parent):
            aside = [n for n in os.listdir(parent) if n.startswith(f".{name}{C.OLD_TAG}")]
            if aside:
                old = os.path.join(parent, aside[0])
                hint = f" A previous version was being replaced when the process stopped: {old}."
        raise CheckpointNotFoundError(f"Tried to find {input_dir} but folder does not exist.{hint}")
    return folder


class _Reader:
    """Reads files of one checkpoint, checking each against the size and hash recorded when it was written."""

    def __init__(self, folder: str, metadata: dict[str, Any] | None, allow_unsafe_pickle: bool | None) -> None:
        self.folder = folder
        self.sizes: dict[str, int] = (metadata or {}).get("files", {})
        self.hashes: dict[str, str] = (metadata or {}).get("hashes", {})  # absent from older checkpoints
        self.hash_algorithm: str = (metadata or {}).get("hash_algorithm", "sha256")
        self.verifier = BackgroundVerifier()  # hashes files while they are parsed; wait() before using them
        self.allow_unsafe_pickle = allow_unsafe_pickle

    def path(self, name: str) -> str:
        path = os.path.join(self.folder, name)
        expected = self.sizes.get(name)
        if expected is not None and os.path.isfile(path) and os.path.getsize(path) != expected:
            raise CorruptCheckpointError(
                f"{path} has {os.path.getsize(path)} bytes but {expected} were written: it was truncated or changed "
                "after saving. Restore it from a copy, or load an earlier checkpoint."
            )
        if os.path.isfile(path):
            self.verifier.submit(path, self.hashes.get(name), self.hash_algorithm)
        return path

    def verify_sharded(self, rank: int, world: int) -> None:
        """Checks the strategy's shard files, each process a share of them (any process's failure is agreed)."""
        names = sorted(n for n in self.hashes if n.startswith(f"{C.SHARDED_DIR}/"))
        for name in names[rank::world]:
            self.path(name)
        self.verifier.wait()

    def torch(self, name: str) -> Any:
        return load_torch_file(self.path(name), self.allow_unsafe_pickle)

    def model(self, index: int, model_format: str | None) -> dict[str, Any]:
        safe = C.indexed(C.MODEL_NAME, index, C.SAFE_MODEL_EXT)
        pickled = C.indexed(C.PICKLE_MODEL_NAME, index, ".bin")
        if model_format == "torch" or (model_format is None and not os.path.exists(os.path.join(self.folder, safe))):
            return self.torch(pickled)
        return read_safetensors(self.path(safe))[0]


# What a checkpoint folder (accel's or the reference's) holds: names start with one of these.
_CHECKPOINT_ENTRIES = (
    C.METADATA_NAME,
    C.COMPLETE_NAME,
    C.MODEL_NAME,
    C.PICKLE_MODEL_NAME,
    C.OPTIMIZER_NAME,
    C.SCHEDULER_NAME,
    C.SCALER_NAME,
    C.RNG_STATE_NAME,
    C.DATALOADER_NAME,
    C.CUSTOM_NAME,
    C.SHARDED_DIR,
    "sampler",
)


def _holds_checkpoint_files(folder: str) -> bool:
    return any(name.startswith(_CHECKPOINT_ENTRIES) for name in os.listdir(folder))


def _no_checkpoint_message(folder: str) -> str:
    entries = sorted(os.listdir(folder))
    held = "it is empty" if not entries else f"it holds {', '.join(entries[:5])}{', ...' if len(entries) > 5 else ''}"
    # A project folder, or its checkpoints/ folder, given instead of one checkpoint: name the newest.
    inside = [
        f.path
        for base in (folder, os.path.join(folder, C.CHECKPOINTS_DIR))
        for f in layout.list_checkpoints(base)
        if f.complete
    ]
    hint = f" Its newest complete checkpoint is {inside[-1]}." if inside else ""
    return (
        f"No checkpoint found in {folder}: {held}. A checkpoint folder holds {C.METADATA_NAME} and {C.COMPLETE_NAME}, "
        f"model.safetensors (one per model), optimizer.bin, scheduler.bin, random_states_<rank>.pt, ... Pass the "
        f"folder save_state() returned, or <project_dir>/checkpoints/checkpoint_<n>.{hint}"
    )


def _check_count(kind: str, saved: int, prepared: int, folder: str) -> None:
    if saved != prepared:
        raise CheckpointMismatchError(
            f"{folder} holds {saved} {kind} but {prepared} were prepared. Prepare the same objects, in the same "
            "order, as in the run that saved it (load hooks may remove models that they load themselves)."
        )


def load_state(
    accelerator: CheckpointAccelerator,
    input_dir: str | None,
    coord: Coordinator,
    allow_unsafe_pickle: bool | None = None,
    load_dataloader_state: bool = True,
    strict: bool = True,
    **kwargs: Any,
) -> str:
    """Collective: every process calls it. Returns the folder loaded."""
    error: BaseException | None = None
    folder = metadata = None
    base: str | None = None
    try:
        # The automatic choice is agreed in a collective: every process must reach it.
        base = _automatic_base(accelerator) if input_dir is None else None
    except Exception as caught:  # noqa: BLE001 - raised on every process by agree()
        error = caught
    coord.agree(error, "load_state")
    try:
        folder = resolve_input_dir(accelerator, input_dir, coord if base is not None else None)
    except Exception as caught:  # noqa: BLE001
        error = caught
    coord.agree(error, "load_state")
    assert folder is not None
    models = access.listed(accelerator, "_models")
    try:
        if not os.path.isdir(folder):
            raise CheckpointNotFoundError(
                f"{folder} is not visible on this machine; use a shared file system or save_on_each_node=True."
            )
        metadata = layout.read_metadata(folder)
        if not layout.is_complete(folder):
            if metadata is not None:
                raise IncompleteCheckpointError(
                    f"{folder} has no {C.COMPLETE_NAME} marker: its save was interrupted, so it may be missing files. "
                    "Load an earlier checkpoint."
                )
            if os.path.basename(folder).startswith("."):
                raise IncompleteCheckpointError(
                    f"{folder} is a checkpoint that was still being written; load a finished one."
                )
            if not _holds_checkpoint_files(folder):
                raise CheckpointNotFoundError(_no_checkpoint_message(folder))
            warnings.warn(
                f"{folder} has no accel-checkpoint metadata: reading it as a reference-layout (legacy) checkpoint.",
                stacklevel=3,
            )
        if (metadata or {}).get("sharded"):
            _Reader(folder, metadata, allow_unsafe_pickle).verify_sharded(
                accelerator.process_index, accelerator.num_processes
            )
        # As in the reference, the hooks get the models this load restores from model files, as it lists them
        # (the user's module, not its DDP wrapper); none when the backend restores them itself (sharded).
        restores_itself = MODELS in ((metadata or {}).get("sharded") or {}).get("covers", ())
        listed = [] if restores_itself else access.hook_models(accelerator, models)
        given = list(listed)
        for hook in accelerator.load_state_pre_hooks:
            hook(given, folder)  # may remove models it loads itself
        if not restores_itself:
            models = [model for model, shown in zip(models, listed, strict=True) if any(shown is g for g in given)]
    except Exception as caught:  # noqa: BLE001
        error = caught
    coord.agree(error, f"opening {folder}")

    sharded = (metadata or {}).get("sharded")
    covered = set(sharded["covers"]) if sharded else set()
    if sharded:
        found = find_sharded(accelerator)
        if found is None:
            if sharded["implementation"] not in _DCP_LAYOUTS:
                raise CheckpointMismatchError(
                    f"{folder} was written by the sharded checkpointing of {sharded['implementation']}; prepare the "
                    "models with the same kind of strategy to load it (or merge it with merge_sharded_checkpoint)."
                )
            # A DCP checkpoint loads into plain (unsharded) models too: DCP reshards to any layout.
            found = (DCPCheckpointing(), "dcp")
        found[0].load_sharded(
            accelerator.prepared,
            os.path.join(folder, C.SHARDED_DIR),
            io=SafeCheckpointIO(coord, allow_unsafe_pickle),
            allow_unsafe_pickle=allow_unsafe_pickle,
        )

    rank = accelerator.process_index
    reader = _Reader(folder, metadata, allow_unsafe_pickle)
    counts = metadata["counts"] if metadata else legacy_counts(folder)
    optimizers = access.listed(accelerator, "_optimizers")
    schedulers = access.listed(accelerator, "_schedulers")
    customs = access.listed(accelerator, "_custom_objects")
    loaders = access.listed(accelerator, "_dataloaders")
    scaler = accelerator.scaler
    saved_world = (metadata or {}).get("world_size", accelerator.num_processes)
    loaded: dict[str, Any] = {}
    try:
        if MODELS not in covered:
            _check_count("models", counts["models"], len(models), folder)
            loaded["models"] = [reader.model(i, (metadata or {}).get("model_format")) for i in range(len(models))]
        if OPTIMIZERS not in covered:
            _check_count("optimizers", counts["optimizers"], len(optimizers), folder)
            classes = (metadata or {}).get("optimizer_classes") or [None] * len(optimizers)
            loaded["optimizers"] = []
            for i, (optimizer, saved_class) in enumerate(zip(optimizers, classes, strict=False)):
                path = reader.path(C.indexed(C.OPTIMIZER_NAME, i, ".bin"))
                check_optimizer_class(optimizer, saved_class, path)
                loaded["optimizers"].append(read_optimizer_state(optimizer, path, allow_unsafe_pickle))
        if SCHEDULERS not in covered:
            _check_count("schedulers", counts["schedulers"], len(schedulers), folder)
            loaded["schedulers"] = [
                reader.torch(C.indexed(C.SCHEDULER_NAME, i, ".bin")) for i in range(len(schedulers))
            ]
        if scaler is not None and counts["scaler"]:
            loaded["scaler"] = reader.torch(C.SCALER_NAME)
        elif scaler is not None or counts["scaler"]:
            logger.warning(
                "GradScaler state %s: the scaler starts fresh.",
                "missing from the checkpoint" if scaler else "not used now",
            )
        if counts["custom_objects"] != len(customs):
            # The reference implementation warns and skips here; kept for compatibility.
            logger.warning(
                "Number of found checkpoints does not match the number of registered objects: found %d, registered %d. "
                "Skipping.",
                counts["custom_objects"],
                len(customs),
            )
        else:
            ext = ".pt" if metadata else ".pkl"
            loaded["customs"] = [reader.torch(f"{C.CUSTOM_NAME}_{i}{ext}") for i in range(len(customs))]
        if load_dataloader_state and metadata and counts["dataloaders"]:
            _check_count("dataloaders", counts["dataloaders"], len(loaders), folder)
            source = rank
            saved_dp = (metadata or {}).get("data_parallel_size", saved_world)
            if saved_world != accelerator.num_processes or saved_dp != access.data_parallel_size(accelerator):
                # Positions of a sharded loader are the same on every process; the loader's own
                # load_state_dict converts them to the new data-parallel size (or says why it cannot).
                # The first process's whose file this folder holds (a folder of its own holds only one).
                source = next(
                    (r for r in range(saved_world) if os.path.exists(os.path.join(folder, C.dataloader_file(0, r)))), 0
                )
                logger.warning(
                    "%s was saved by %d processes (%d data-parallel), %d (%d) run now: every dataloader resumes from "
                    "process %d's position.",
                    folder,
                    saved_world,
                    saved_dp,
                    accelerator.num_processes,
                    access.data_parallel_size(accelerator),
                    source,
                )
            loaded["loaders"] = [reader.torch(C.dataloader_file(i, source)) for i in range(len(loaders))]
        rng_name = C.rng_file(rank) if metadata else f"{C.RNG_STATE_NAME}_{rank}{C.LEGACY_RNG_EXT}"
        if os.path.exists(os.path.join(folder, rng_name)):
            loaded["rng"] = reader.torch(rng_name)
        else:
            logger.warning(
                "%s has no RNG state for process %d (saved with %d processes): RNGs are not restored.",
                folder,
                rank,
                saved_world,
            )
    except Exception as caught:  # noqa: BLE001
        error = caught
    try:
        reader.verifier.wait()  # a file that does not hash as written is refused before anything changes
    except Exception as caught:  # noqa: BLE001
        error = caught  # the root cause, where parsing the changed file also failed
    coord.agree(error, f"reading {folder}")

    try:
        # The loaders first: one refusing its saved position (its data changed since the checkpoint) fails the load
        # before any other object has changed.
        for i, (loader, state) in enumerate(zip(loaders, loaded.get("loaders", []), strict=False)):
            restore_dataloader_state(loader, state, os.path.join(folder, C.dataloader_file(i, rank)))
        for model, state in zip(models, loaded.get("models", []), strict=False):
            access.load_model_state_dict(accelerator, model, state, strict=strict)
        for optimizer, state in zip(optimizers, loaded.get("optimizers", []), strict=False):
            load_optimizer_state(optimizer, state)
        for scheduler, state in zip(schedulers, loaded.get("schedulers", []), strict=False):
            scheduler.load_state_dict(state)
        if "scaler" in loaded and scaler is not None:  # read above only when there is a scaler
            scaler.load_state_dict(loaded["scaler"])
        for obj, state in zip(customs, loaded.get("customs", []), strict=False):
            obj.load_state_dict(state)
        if "rng" in loaded:
            (restore_rng_state if metadata else restore_legacy_rng_state)(loaded["rng"])
    except Exception as caught:  # noqa: BLE001
        error = caught
    coord.agree(error, f"restoring the state of {folder}")

    step = (metadata or {}).get("step")
    if step is not None:
        accelerator.step = step
    progress = (metadata or {}).get("progress")
    if progress is not None:
        accelerator.restore_training_progress(progress)
    config = accelerator.project_configuration
    number = layout.number_of(folder)
    if (
        config is not None
        and config.automatic_checkpoint_naming
        and config.project_dir
        and number is not None
        and os.path.abspath(os.path.dirname(folder)) == os.path.abspath(layout.checkpoints_dir(config.project_dir))
    ):
        config.iteration = number + 1  # the next automatic save continues the numbering
    logger.info("Loaded state from %s", folder)
    return folder
