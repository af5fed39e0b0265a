"""Merging a sharded checkpoint into one safetensors file (for inference, export, or another tool)."""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from . import constants as C
from .errors import CheckpointNotFoundError
from .fsio import replace_file_atomically
from .model_files import read_model_files
from .safetensors_io import dedupe, safetensors_metadata, write_safetensors


def _is_dcp(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, ".metadata"))


def _read_any(source: str, model_index: int, allow_unsafe_pickle: bool | None) -> dict[str, torch.Tensor]:
    if _is_dcp(source):
        from .dcp_safe import read_dcp_tensors

        tensors = read_dcp_tensors(source, allow_unsafe_pickle=allow_unsafe_pickle)
        # accel's DCP layout stores {"model": state_dict}: drop that top-level key from the names.
        if tensors and all(k.startswith("model.") for k in tensors):
            tensors = {k[len("model.") :]: v for k, v in tensors.items()}
        return tensors
    sharded_model = os.path.join(source, C.SHARDED_DIR, f"model_{model_index}")
    if os.path.isdir(sharded_model) and _is_dcp(sharded_model):  # a whole accel checkpoint folder
        return _read_any(sharded_model, model_index, allow_unsafe_pickle)
    if os.path.isdir(source):
        single = C.indexed(C.MODEL_NAME, model_index, C.SAFE_MODEL_EXT)
        if model_index and os.path.isfile(os.path.join(source, single)):
            return read_model_files(os.path.join(source, single), allow_unsafe_pickle)
        return read_model_files(source, allow_unsafe_pickle)
    raise CheckpointNotFoundError(f"{source} does not exist.")


def merge_sharded_checkpoint(
    checkpoint_dir: str, output_path: str, model_index: int = 0, allow_unsafe_pickle: bool | None = None
) -> str:
    """Writes the full weights of a sharded checkpoint as one safetensors file; returns its path.

    ``checkpoint_dir`` may be a folder of safetensors shards with ``model.safetensors.index.json``
    (or ``pytorch_model.bin.index.json``), a ``torch.distributed.checkpoint`` folder, or a whole
    accel checkpoint whose models were saved sharded (``sharded/model_<model_index>``).
    ``output_path`` is a file, or a folder that receives ``model.safetensors``. Runs in one process.

    Example::

        merge_sharded_checkpoint("runs/exp/checkpoints/checkpoint_3", "export/model.safetensors")
    """
    tensors: dict[str, Any] = _read_any(os.path.abspath(checkpoint_dir), model_index, allow_unsafe_pickle)
    if os.path.isdir(output_path) or not output_path.endswith(C.SAFE_MODEL_EXT):
        os.makedirs(output_path, exist_ok=True)
        output_path = os.path.join(output_path, f"{C.MODEL_NAME}{C.SAFE_MODEL_EXT}")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    unique, aliases = dedupe(tensors)
    metadata = safetensors_metadata(aliases)
    replace_file_atomically(lambda tmp: write_safetensors(unique, tmp, metadata), output_path)
    return output_path


def merge_fsdp_weights(
    checkpoint_dir: str, output_path: str, safe_serialization: bool = True, remove_checkpoint_dir: bool = False
) -> None:
    """The reference's name: merges a sharded (FSDP ``SHARDED_STATE_DICT``) model checkpoint into one file.

    Writes ``<output_path>/model.safetensors`` (``pytorch_model.bin`` without ``safe_serialization``)
    on the main process; the others wait. ``remove_checkpoint_dir`` deletes the sharded folder after.

    Example::

        merge_fsdp_weights("checkpoint/pytorch_model_fsdp_0", "merged")
    """
    from accel_core.state import PartialState

    if not os.path.isdir(checkpoint_dir):
        raise ValueError(
            f"Tried to load from {checkpoint_dir} but couldn't find a valid metadata file: pass the sharded model "
            "folder."
        )
    state = PartialState()
    if state.is_main_process:
        if safe_serialization:
            merge_sharded_checkpoint(checkpoint_dir, output_path)
        else:
            tensors = _read_any(os.path.abspath(checkpoint_dir), 0, None)
            os.makedirs(output_path, exist_ok=True)
            torch.save(tensors, os.path.join(output_path, f"{C.PICKLE_MODEL_NAME}.bin"))
        if remove_checkpoint_dir:
            shutil.rmtree(checkpoint_dir)
    state.wait_for_everyone()
