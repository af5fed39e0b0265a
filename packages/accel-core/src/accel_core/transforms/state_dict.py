"""Full (unsharded) state dicts of models whose tensors may be DTensors (tensor parallel, FSDP2)."""

from __future__ import annotations

from typing import Any

from torch import nn


def has_dtensors(model: nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(t, DTensor) for t in list(model.parameters()) + list(model.buffers()))


def full_state_dict(model: nn.Module) -> dict[str, Any]:
    """The whole model's weights: a plain ``state_dict`` when nothing is distributed; otherwise gathered
    onto process 0's CPU (``{}`` on the others). Collective in the second case."""
    if not has_dtensors(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state_dict(model: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> Any:
    """Loads full weights (the same on every process); distributed tensors keep their own part. Collective
    when the model holds DTensors."""
    if not has_dtensors(model):
        return model.load_state_dict(state_dict, strict=strict)
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    return set_model_state_dict(model, state_dict, options=StateDictOptions(full_state_dict=True, strict=strict))
