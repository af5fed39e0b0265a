"""File and folder names of a checkpoint, in one place so the writer and the reader agree."""

from __future__ import annotations

MODEL_NAME = "model"  # model.safetensors, model_1.safetensors, ...
SAFE_MODEL_EXT = ".safetensors"
PICKLE_MODEL_NAME = "pytorch_model"  # pytorch_model.bin (safe_serialization=False, or legacy)
OPTIMIZER_NAME = "optimizer"  # optimizer.bin, optimizer_1.bin, ...
SCHEDULER_NAME = "scheduler"  # scheduler.bin, scheduler_1.bin, ...
SCALER_NAME = "scaler.pt"
RNG_STATE_NAME = "random_states"  # random_states_<rank>.pt
LEGACY_RNG_EXT = ".pkl"  # random_states_<rank>.pkl written by the reference implementation
DATALOADER_NAME = "dataloader"  # dataloader_<i>_rank_<r>.pt
CUSTOM_NAME = "custom_checkpoint"  # custom_checkpoint_<i>.pt (legacy: .pkl)
SHARDED_DIR = "sharded"  # sharded/ : whatever a ShardedCheckpointing implementation writes

METADATA_NAME = "accel_checkpoint.json"
COMPLETE_NAME = "COMPLETE"  # written last; a folder without it is not a finished checkpoint

CHECKPOINTS_DIR = "checkpoints"  # <project_dir>/checkpoints/checkpoint_<n>
CHECKPOINT_PREFIX = "checkpoint_"
PARTIAL_TAG = ".partial-"  # .<final name>.partial-<token>: a checkpoint being written
OLD_TAG = ".old-"  # .<final name>.old-<token>: the previous folder while it is replaced

FORMAT_NAME = "accel-checkpoint"
FORMAT_VERSION = 1

# Opt-in for loading pickles that may run code (trusted files from older tools only).
UNSAFE_PICKLE_ENV = "ACCEL_ALLOW_UNSAFE_PICKLE"
FSYNC_ENV = "ACCEL_CHECKPOINT_FSYNC"  # "0": do not wait for the disk (see save_state(durable=...))

SAFE_INDEX_NAME = "model.safetensors.index.json"
PICKLE_INDEX_NAME = "pytorch_model.bin.index.json"


def indexed(name: str, index: int, ext: str) -> str:
    """``model.safetensors`` for index 0, ``model_1.safetensors`` for index 1 (the reference layout)."""
    return f"{name}{ext}" if index == 0 else f"{name}_{index}{ext}"


def rng_file(rank: int) -> str:
    return f"{RNG_STATE_NAME}_{rank}.pt"


def dataloader_file(index: int, rank: int) -> str:
    return f"{DATALOADER_NAME}_{index}_rank_{rank}.pt"


def custom_file(index: int) -> str:
    return f"{CUSTOM_NAME}_{index}.pt"
