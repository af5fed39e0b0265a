"""Accelerate's ``save_fsdp_model`` / ``load_fsdp_model`` / ``save_fsdp_optimizer`` / ``load_fsdp_optimizer``: an FSDP
model's and optimizer's state in the files transformers' ``Trainer`` writes into its ``checkpoint-<step>`` folders.

The plugin's ``state_dict_type`` picks the layout (Accelerate's names, so a Trainer finds them on resume):

- ``FULL_STATE_DICT``: ``pytorch_model_fsdp.bin`` / ``optimizer.bin`` (``_<i>`` for the i-th model or optimizer
  after the first), the whole state gathered on process 0 and written there;
- ``SHARDED_STATE_DICT``: ``pytorch_model_fsdp_<i>/`` / ``optimizer_<i>/``, DCP folders in which every process
  writes its shards (read back on any number of processes); with ``use_dcp=False`` one ``torch.save`` file per
  process instead (``..._rank<r>.bin``), read back on the same number of processes.

The state dicts are torch's (``torch.distributed.checkpoint.state_dict``), as in accel-fsdp's own checkpoints, for
FSDP2 and FSDP1 alike. Every function is collective: all processes call it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accel_core.optimizer import unwrap_optimizer

from .checkpointing import _resharded, full_model_state_dict, load_full_model_state_dict

FSDP_MODEL_NAME = "pytorch_model_fsdp"
OPTIMIZER_NAME = "optimizer"


def _is_full(fsdp_plugin: Any) -> bool:
    return fsdp_plugin.state_dict_type == "FULL_STATE_DICT"


def _options(full: bool, adapter_only: bool, strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # adapter_only (PEFT): the trainable parameters only; the frozen base model is not written, nor expected back.
    return StateDictOptions(
        full_state_dict=full, cpu_offload=full, ignore_frozen_params=adapter_only, strict=strict and not adapter_only
    )


def _dcp_folder(input_dir: str | os.PathLike[str], name: str) -> Path:
    """``input_dir/<name>``, or ``input_dir`` itself when it is that folder already (as Accelerate accepts)."""
    path = Path(input_dir)
    return path if path.name == name else path / name


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: nn.Module,
    output_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Writes ``model``'s state into ``output_dir`` in the layout of ``fsdp_plugin.state_dict_type`` (module docstring).
    adapter_only: only the trainable parameters (a PEFT adapter). Collective.

    Example::

        save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, "checkpoint-10")
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    os.makedirs(output_dir, exist_ok=True)
    (model,) = _resharded([model])
    if _is_full(fsdp_plugin):
        if adapter_only:
            state = get_model_state_dict(model, options=_options(True, True))
        else:
            state = full_model_state_dict(model)
        name = f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"
        if accelerator.process_index == 0:
            torch.save(state, os.path.join(output_dir, name))
    else:
        state = get_model_state_dict(model, options=_options(False, adapter_only))
        if use_dcp:
            dcp.save({"model": state}, checkpoint_id=os.path.join(output_dir, f"{FSDP_MODEL_NAME}_{model_index}"))
        else:
            name = f"{FSDP_MODEL_NAME}_{model_index}_rank{accelerator.process_index}.bin"
            torch.save(state, os.path.join(output_dir, name))
    accelerator.wait_for_everyone()


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: nn.Module,
    input_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> Any:
    """Loads what ``save_fsdp_model`` wrote (the same ``state_dict_type``) into ``model``; returns torch's
    ``(missing_keys, unexpected_keys)``. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    accelerator.wait_for_everyone()
    (model,) = _resharded([model])
    if _is_full(fsdp_plugin):
        name = f"{FSDP_MODEL_NAME}.bin" if model_index == 0 else f"{FSDP_MODEL_NAME}_{model_index}.bin"
        state = torch.load(os.path.join(input_dir, name), weights_only=True, map_location="cpu")
        if adapter_only:
            result = set_model_state_dict(model, state, options=_options(True, True))
        else:
            result = load_full_model_state_dict(model, state)
    else:
        if use_dcp:
            folder = _dcp_folder(input_dir, f"{FSDP_MODEL_NAME}_{model_index}")
            holder = {"model": get_model_state_dict(model, options=_options(False, adapter_only))}
            dcp.load(holder, checkpoint_id=str(folder))
            state = holder["model"]
        else:
            name = f"{FSDP_MODEL_NAME}_{model_index}_rank{accelerator.process_index}.bin"
            state = torch.load(os.path.join(input_dir, name), weights_only=True, map_location="cpu")
        result = set_model_state_dict(model, state, options=_options(False, adapter_only))
    accelerator.wait_for_everyone()
    return result


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: nn.Module,
    output_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Writes the state of ``optimizer`` (over ``model``'s parameters) into ``output_dir``. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    os.makedirs(output_dir, exist_ok=True)
    (model,) = _resharded([model])
    full = _is_full(fsdp_plugin)
    state = get_optimizer_state_dict(model, unwrap_optimizer(optimizer), options=_options(full, False))
    if full:
        name = f"{OPTIMIZER_NAME}.bin" if optimizer_index == 0 else f"{OPTIMIZER_NAME}_{optimizer_index}.bin"
        if accelerator.process_index == 0:
            torch.save(state, os.path.join(output_dir, name))
    elif use_dcp:
        dcp.save({"optimizer": state}, checkpoint_id=os.path.join(output_dir, f"{OPTIMIZER_NAME}_{optimizer_index}"))
    else:
        torch.save(
            state, os.path.join(output_dir, f"{OPTIMIZER_NAME}_{optimizer_index}_rank{accelerator.process_index}.bin")
        )
    accelerator.wait_for_everyone()


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: nn.Module,
    input_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Loads what ``save_fsdp_optimizer`` wrote into ``optimizer``. ``adapter_only`` is accepted for Accelerate's
    signature (an optimizer holds only what it trains). Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    accelerator.wait_for_everyone()
    (model,) = _resharded([model])
    optimizer = unwrap_optimizer(optimizer)
    full = _is_full(fsdp_plugin)
    if full:
        name = f"{OPTIMIZER_NAME}.bin" if optimizer_index == 0 else f"{OPTIMIZER_NAME}_{optimizer_index}.bin"
        state = torch.load(os.path.join(input_dir, name), weights_only=True, map_location="cpu")
    elif use_dcp:
        holder = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        dcp.load(holder, checkpoint_id=str(_dcp_folder(input_dir, f"{OPTIMIZER_NAME}_{optimizer_index}")))
        state = holder["optimizer"]
    else:
        name = f"{OPTIMIZER_NAME}_{optimizer_index}_rank{accelerator.process_index}.bin"
        state = torch.load(os.path.join(input_dir, name), weights_only=True, map_location="cpu")
    set_optimizer_state_dict(model, optimizer, state, options=_options(full, False))
    accelerator.wait_for_everyone()
