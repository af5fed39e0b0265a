"""A prepared model's full state dict through its record and strategy: the one path ``get_state_dict``,
``save_state`` and ``load_state`` take (pipeline stages gathered, shards through the strategy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..prepared_model import PreparedModel
    from .base import Strategy


def prepared_model_state_dict(strategy: Strategy, prepared: PreparedModel) -> dict[str, Any]:
    """The full state dict of a prepared model (its record), the one path ``get_state_dict`` and ``save_state`` take: a
    model split into pipeline stages (torch's or Megatron's) is gathered over them onto the main process, any other
    through its strategy, outside ``torch.compile``'s wrapper (the model's own keys). Collective."""
    if prepared.pipeline is not None:
        return prepared.pipeline.full_state_dict()
    return strategy.model_state_dict(prepared.wrapped)


def load_prepared_model_state_dict(
    strategy: Strategy, prepared: PreparedModel, state_dict: dict[str, Any], strict: bool = True
) -> Any:
    """Loads full weights into a prepared model (the inverse of ``prepared_model_state_dict``): pipeline stages take
    their own keys, shards keep their part."""
    if prepared.pipeline is not None:
        return prepared.pipeline.load_full_state_dict(state_dict, strict=strict)
    return strategy.load_model_state_dict(prepared.wrapped, state_dict, strict=strict)
