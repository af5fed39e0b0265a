"""One record per prepared model: what the user passed, what runs forward, its wrapper, the user's module inside, and
the pipeline stages it was split into.

``prepare`` makes the record once, from what the transform chain returned (``ModelParts``, the answer of
``Strategy.parallelize``), and keeps it in ``PreparedObjects.records``. Everything that later needs one of these
parts (``unwrap_model``, a second ``prepare``, autocast, ``_models`` and the state hooks, ``get_state_dict``,
``save_state``, ``forward_backward``) reads it from the record instead of peeling the prepared object again.

Example::

    record = accelerator.prepared.record_of(model)   # model: what prepare returned (or the module you passed)
    record.module.state_dict()                        # the user's module, outside DDP and torch.compile
    record.pipeline is not None                       # split into pipeline stages?
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from .pipelining.model import StagedModel


@dataclass(frozen=True)
class ModelParts:
    """What a strategy's transform chain (``Strategy.parallelize``) hands back for one model (or pipeline stage).

    runs: what the script calls forward on (the wrapper, or ``torch.compile``'s module around it).
    wrapped: the strategy's wrapper (DDP, FSDP1, an engine), or the user's module where the strategy keeps that object
        (FSDP2, one device): ``runs`` without ``torch.compile``'s wrapper.
    module: the user's module inside ``wrapped``, where state dicts, hooks and autocast apply.
    """

    runs: nn.Module
    wrapped: nn.Module
    module: nn.Module


@dataclass(frozen=True)
class PreparedModel:
    """One prepared model, made once by ``prepare`` and read everywhere (``PreparedObjects.records``).

    given: the module the user passed to ``prepare``.
    runs: what ``prepare`` returned, and the script calls forward on (a wrapper, a compiled module, a pipeline).
    wrapped: ``runs`` without ``torch.compile``'s wrapper: the strategy's wrapper, or the user's module.
    module: the user's module inside the wrapper (for a model split into pipeline stages: the pipeline, whose state
        dict holds this rank's stages under the whole model's names).
    pipeline: the pipeline when the model was split into stages (torch's or Megatron's), else None.
    """

    given: nn.Module
    runs: nn.Module
    wrapped: nn.Module
    module: nn.Module
    pipeline: StagedModel | None = None

    @classmethod
    def made(cls, given: nn.Module, parts: ModelParts) -> PreparedModel:
        """The record of ``given`` prepared into ``parts``; a backend that splits the model itself (Megatron) returns
        its pipeline as ``runs``, which is recorded as such."""
        from .pipelining.model import StagedModel

        pipeline = parts.runs if isinstance(parts.runs, StagedModel) else None
        return cls(given, parts.runs, parts.wrapped, parts.module, pipeline)

    @classmethod
    def split(cls, given: nn.Module, pipeline: StagedModel) -> PreparedModel:
        """The record of ``given`` split into the stages of ``pipeline`` (each stage through the chain on its own)."""
        return cls(given, pipeline, pipeline, pipeline, pipeline)

    @classmethod
    def unprepared(cls, model: nn.Module, unwrap: Callable[[nn.Module], nn.Module]) -> PreparedModel:
        """A record for a model ``prepare`` never saw (wrapped or compiled by the script itself): its parts found the
        only way left, by looking inside ``torch.compile``'s wrapper and the strategy's (``unwrap``: the strategy's
        ``unwrap_model``)."""
        from .model_utils import uncompiled

        wrapped = uncompiled(model)
        return cls.made(model, ModelParts(model, wrapped, unwrap(wrapped)))

    @property
    def stages(self) -> list[nn.Module]:
        """This rank's pipeline stages (the user's model pruned to each, unwrapped); empty when not split."""
        return self.pipeline.stage_modules if self.pipeline is not None else []

    @property
    def forward_modules(self) -> Sequence[nn.Module]:
        """Where autocast wraps the forward: inside each stage (not around the schedule), else the user's module."""
        return self.stages or [self.module]

    def holds(self, obj: Any) -> bool:
        """Whether ``obj`` is one of this model's parts (what was passed, what runs, the wrapper, the module)."""
        return obj is self.runs or obj is self.given or obj is self.wrapped or obj is self.module
