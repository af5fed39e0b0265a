"""accel-checkpoint: ``save_state`` / ``load_state`` that resume exactly, survive a crash mid-save,
and never unpickle untrusted code. Registered as the ``accel.checkpoint: state`` entry point.

Names are imported lazily so ``import accel_checkpoint`` does not import torch.

Example::

    from accel_checkpoint import merge_sharded_checkpoint
    merge_sharded_checkpoint("runs/exp/checkpoints/checkpoint_3", "export/model.safetensors")
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accel_core.protocols import CheckpointAccelerator

__version__ = "0.1.0"

_EXPORTS = {
    "HANDLER": "integration",
    "StateCheckpointer": "integration",
    "ShardedCheckpointing": "sharded",
    "DCPCheckpointing": "sharded",
    "merge_sharded_checkpoint": "merge",
    "write_model_files": "model_files",
    "read_model_files": "model_files",
    "load_model": "model_files",
    "load_torch_file": "safe_load",
    "CheckpointError": "errors",
    "CheckpointNotFoundError": "errors",
    "IncompleteCheckpointError": "errors",
    "CorruptCheckpointError": "errors",
    "UnsafeCheckpointError": "errors",
    "CheckpointMismatchError": "errors",
    "CheckpointFormatError": "errors",
    "ProjectLockedError": "project_lock",
    "UNSAFE_PICKLE_ENV": "constants",
}

__all__ = [*sorted(_EXPORTS), "wait_for_checkpoint"]


def wait_for_checkpoint(accelerator: CheckpointAccelerator) -> str | None:
    """Blocks until ``accelerator``'s pending async ``save_state`` is complete on disk; returns its folder."""
    from .integration import HANDLER

    return HANDLER.wait(accelerator)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
