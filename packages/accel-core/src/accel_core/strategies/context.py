"""What a strategy is given: a narrow, public view of the job (``StrategyContext``) and of what was prepared.

A strategy reads these and returns what it prepared; it never writes the Accelerator's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from ..configuration import TorchDynamoPlugin
    from ..parallel.dims import ParallelDims
    from ..precision.modes import Precision
    from ..prepared_model import PreparedModel
    from ..settings import RunSettings
    from ..state import AcceleratorState, GradientState
    from .selection import StrategyPlan


@dataclass
class PreparedObjects:
    """Everything prepared (or registered for checkpointing), in ``prepare`` order; the Accelerator owns the lists.

    records: one ``PreparedModel`` per prepared model (what was passed, what runs, its wrapper, the user's module,
    its pipeline stages), made once by ``prepare``. Readers (strategies, accel-checkpoint) treat the lists as
    read-only.
    """

    records: list[PreparedModel] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom_objects: list[Any] = field(default_factory=list)

    @property
    def models(self) -> list[Any]:
        """The prepared models as ``prepare`` returned them (wrappers included), in a new list each time."""
        return [record.runs for record in self.records]

    def record_of(self, model: Any) -> PreparedModel | None:
        """The record of ``model`` (what ``prepare`` returned, or any part of it: the module passed, the wrapper, the
        user's module inside), or None when ``prepare`` never saw it."""
        return next((record for record in self.records if record.holds(model)), None)

    def record_for(self, model: Any, unwrap: Callable[[Any], Any]) -> PreparedModel:
        """The record of ``model``, or, for a model ``prepare`` never saw, one made now (``PreparedModel.unprepared``;
        ``unwrap``: the strategy's ``unwrap_model``)."""
        from ..prepared_model import PreparedModel

        return self.record_of(model) or PreparedModel.unprepared(model, unwrap)

    def clear(self) -> None:
        """Forgets every prepared object (``free_memory``), keeping the same lists."""
        for items in (self.records, self.optimizers, self.schedulers, self.dataloaders):
            items.clear()


@dataclass
class StrategyContext:
    """The job as a strategy sees it (given to ``Strategy.setup``).

    state: the process state (rank, world, main process, ``device``: this process's device).
    dims: the mesh and its groups. precision: the Precision object (transforms ask it).
    plan: what was resolved from arguments and settings. gradient_state: accumulation (is
    this micro-step a synchronising one?). prepared: the prepared objects. settings: the run's
    settled record (``accel_core.settings``): a strategy reads the launcher's variables there, never in
    ``os.environ``. device_placement / step_scheduler_with_optimizer: the
    Accelerator's settings of those names. scheduler_steps_per_optimizer_step: how many steps a
    prepared LR scheduler makes per optimizer step (``Accelerator.scheduler_stepping``).
    dynamo_plugin: how models are compiled (``TorchDynamoPlugin``; None: not at all).
    """

    state: AcceleratorState
    dims: ParallelDims
    precision: Precision
    plan: StrategyPlan
    gradient_state: GradientState
    prepared: PreparedObjects
    settings: RunSettings
    device_placement: bool = True
    step_scheduler_with_optimizer: bool = True
    scheduler_steps_per_optimizer_step: int = 1
    dynamo_plugin: TorchDynamoPlugin | None = None

    @property
    def device(self) -> torch.device:
        """This process's device (the process state's: one value, held once)."""
        return self.state.device

    @property
    def sync_gradients(self) -> bool:
        """Whether the current micro-step synchronises gradients (and the optimizer steps)."""
        return bool(self.gradient_state.sync_gradients)


@dataclass
class JointResult:
    """What ``Strategy.prepare_objects`` returns.

    objects: replacements for the objects given, in the same order (the Accelerator registers
        models, optimizers and schedulers among them in that order).
    extra_optimizers: optimizers the backend created that the script holds no handle on (a
        DeepSpeed config optimizer); registered too, so step-skip reporting and hooks see them.
    """

    objects: list[Any]
    extra_optimizers: list[Any] = field(default_factory=list)
