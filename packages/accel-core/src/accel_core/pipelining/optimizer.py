"""An optimizer built on the whole model before ``prepare``, rebuilt on this rank's pipeline stage(s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..optimizer_rebuild import ParameterNames
    from .model import StagedModel


def rebuild_for_stages(
    optimizer: torch.optim.Optimizer, model: StagedModel, names: ParameterNames
) -> torch.optim.Optimizer:
    """The same optimizer (class, hyper-parameters, groups) over the parameters of ``model``'s local stages only:
    the other stages' parameters are not on this rank."""
    from ..optimizer_rebuild import rebuild

    held: dict[str, torch.Tensor] = {}
    for stage in model.stage_modules:
        held.update(dict(stage.named_parameters()))
    return rebuild(optimizer, model, names, announce=False, stage_parameters=held)
