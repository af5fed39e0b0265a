"""The Accelerator's ``prepare`` family: models through the transform chain, optimizers, schedulers, dataloaders;
and ``register_for_checkpointing``.

What is prepared is registered in the Accelerator's ``PreparedObjects`` (the lists strategies and
accel-checkpoint read); strategies return what they prepared and never register it themselves. Each model gets
its one record there (``PreparedModel``), made here from what the strategy's chain returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from .. import discovery
from ..enums import SchedulerStepping
from ..optimizer import AcceleratedOptimizer
from ..optimizer_rebuild import ParameterNames
from ..optimizer_rebuild import parameter_ids as optimizer_parameter_ids
from ..prepared_model import PreparedModel
from ..scheduler import AcceleratedScheduler
from ..strategies import BatchTransfer, ReducesGradients

if TYPE_CHECKING:
    from ..configuration import DataLoaderConfiguration
    from ..protocols import BatchBoundaryHook, DataAccelerator
    from ..strategies import JointResult, Strategy, StrategyContext
    from .nonfinite_guard import NonFiniteGuard

_SUPPORTED = (
    "torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler and torch.utils.data.DataLoader"
)


def scheduler_steps_for(
    stepping: SchedulerStepping, dataloader_config: DataLoaderConfiguration, data_parallel_size: int
) -> int:
    """LR scheduler steps per optimizer step: the data-parallel size (1 with ``split_batches``) with
    ``scheduler_stepping="per_process"``, 1 with ``"per_optimizer_step"``."""
    if stepping == SchedulerStepping.PER_OPTIMIZER_STEP or dataloader_config.split_batches:
        return 1
    return data_parallel_size


class Preparation:
    """The Accelerator's ``prepare`` family and ``register_for_checkpointing``: the two ways objects enter its
    ``PreparedObjects`` (``context.prepared``).

    strategy, context: what prepares (the transform chain reads the context: device, mesh, precision).
    data_accelerator: what accel-data's preparer reads (the Accelerator, as a ``DataAccelerator``).
    dataloader_config: ``split_batches`` for schedulers. device_placement, step_scheduler_with_optimizer,
    scheduler_stepping: the Accelerator's settings (the first two may be set again on the Accelerator).
    nonfinite_guard: given to each prepared optimizer (None without ``skip_nonfinite``). The rest comes from
    Resumption: after_prepare (resume once everything is prepared again), optimizer_stepped (each prepared
    optimizer's ``on_step``) and boundary_hook (given to each prepared loader).
    """

    def __init__(
        self,
        strategy: Strategy,
        context: StrategyContext,
        data_accelerator: DataAccelerator,
        dataloader_config: DataLoaderConfiguration,
        device_placement: bool,
        step_scheduler_with_optimizer: bool,
        scheduler_stepping: SchedulerStepping,
        nonfinite_guard: NonFiniteGuard | None,
        after_prepare: Callable[[], None],
        optimizer_stepped: Callable[[], None],
        boundary_hook: BatchBoundaryHook,
    ) -> None:
        self.strategy = strategy
        self._context = context
        self.prepared = context.prepared
        self.precision = context.precision
        self._data_accelerator = data_accelerator
        self._dataloader_config = dataloader_config
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.scheduler_stepping = scheduler_stepping
        self._nonfinite_guard = nonfinite_guard
        self._after_prepare = after_prepare
        self._optimizer_stepped = optimizer_stepped
        self._boundary_hook = boundary_hook
        self._parameter_names = ParameterNames()

    def prepare(self, *args: Any, device_placement: Sequence[bool | None] | None = None) -> Any:
        """``Accelerator.prepare``: dataloaders first, then the strategy's joint or separate path; an object prepared
        before comes back as the prepared object."""
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"`device_placement` should be a list with {len(args)} elements (the number of objects passed), "
                f"got {len(device_placement)}."
            )
        earlier = [self._prepared_before(obj) for obj in args]
        if any(e is not None for e in earlier):
            fresh = [i for i, e in enumerate(earlier) if e is None]
            if fresh:
                done = self.prepare(*(args[i] for i in fresh), device_placement=[device_placement[i] for i in fresh])
                for i, obj in zip(fresh, done if len(fresh) > 1 else (done,), strict=True):
                    earlier[i] = obj
            return earlier[0] if len(earlier) == 1 else tuple(earlier)
        for obj in args:
            if not isinstance(
                obj, (torch.nn.Module, torch.optim.Optimizer, LRScheduler, torch.utils.data.DataLoader)
            ) and not self.strategy.accepts_object(obj):
                raise TypeError(
                    f"Cannot prepare an object of type {type(obj).__name__}: prepare accepts {_SUPPORTED}. "
                    "Leave other objects out of prepare()."
                )
        result: list[Any] = list(args)
        # Dataloaders first: a joint preparation (DeepSpeed) needs their batch size.
        for i, obj in enumerate(args):
            if isinstance(obj, torch.utils.data.DataLoader):
                result[i] = self.prepare_data_loader(obj, device_placement=device_placement[i])
        placement = device_placement
        joint = self.strategy.prepare_objects(result, lambda objects: self._prepare_separately(objects, placement))
        result = self._register(args, joint)
        self._after_prepare()
        return result[0] if len(result) == 1 else tuple(result)

    def _prepared_before(self, obj: Any) -> Any:
        """The prepared object ``obj`` is or wraps (a second ``prepare`` of it), else None."""
        record = self.prepared.record_of(obj)
        if record is not None:
            return record.runs
        for items in (self.prepared.optimizers, self.prepared.schedulers, self.prepared.dataloaders):
            if any(obj is item for item in items):
                return obj
        for optimizer in self.prepared.optimizers:
            if obj is getattr(optimizer, "optimizer", None):
                return optimizer
        for scheduler in self.prepared.schedulers:
            if obj is getattr(scheduler, "scheduler", None):
                return scheduler
        return None

    def _register(self, given: Sequence[Any], joint: JointResult) -> list[Any]:
        """Registers what the strategy prepared and the separate path has not registered already, by the kind of
        object given: models, optimizers, then anything else but dataloaders among the schedulers."""
        objects = list(joint.objects)
        self.prepared.optimizers.extend(joint.extra_optimizers)
        for original, prepared in zip(given, objects, strict=False):
            if self._prepared_before(prepared) is prepared:
                continue
            if isinstance(original, torch.nn.Module):
                # Prepared jointly by the backend (DeepSpeed's engine): its parts as the strategy declares them.
                module = self.strategy.unwrap_model(prepared)
                self.prepared.records.append(PreparedModel(original, prepared, prepared, module))
            elif isinstance(original, torch.optim.Optimizer):
                if isinstance(prepared, AcceleratedOptimizer):
                    prepared.on_step = self._optimizer_stepped
                self.prepared.optimizers.append(prepared)
            elif not isinstance(original, torch.utils.data.DataLoader):
                self.prepared.schedulers.append(prepared)
        return objects

    def _prepare_separately(self, objects: list[Any], device_placement: Sequence[bool | None]) -> list[Any]:
        # Parameters of each model before wrapping, to find which model an optimizer belongs to.
        originals: list[tuple[set[int], PreparedModel]] = []
        for i, obj in enumerate(objects):
            if isinstance(obj, torch.nn.Module):
                parameter_ids = {id(p) for p in obj.parameters()}
                record = self.prepared.record_of(obj) or self._prepare_record(obj, device_placement[i])
                objects[i] = record.runs
                originals.append((parameter_ids, record))
        rebuilt: dict[int, torch.optim.Optimizer] = {}
        for i, obj in enumerate(objects):
            if isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, AcceleratedOptimizer):
                if originals and not any(ids & optimizer_parameter_ids(obj) for ids, _ in originals):
                    _check_same_device(obj, [record.runs for _, record in originals])
                    self._check_trains_a_prepared_model(obj, originals, objects)
                if self._replaces_parameters(originals):
                    new = self._rebuild_for_wrapped_model(obj, originals)
                    rebuilt[id(obj)] = new
                    obj = new
                objects[i] = self.prepare_optimizer(obj, device_placement=device_placement[i])
        for i, obj in enumerate(objects):
            if isinstance(obj, LRScheduler):
                if id(obj.optimizer) in rebuilt:
                    obj.optimizer = rebuilt[id(obj.optimizer)]
                objects[i] = self.prepare_scheduler(obj)
        return objects

    def _check_trains_a_prepared_model(
        self, optimizer: torch.optim.Optimizer, originals: list[tuple[set[int], PreparedModel]], objects: list[Any]
    ) -> None:
        """Refuses an optimizer over none of the models prepared with it when a model of the call is then left with no
        optimizer at all: it was built on another model (``AdamW(other.parameters())``), and the losses would not move,
        silently. An extra optimizer over parameters outside the models (a learnable temperature) next to the
        model's own optimizer stays allowed."""
        owned = optimizer_parameter_ids(optimizer)
        if not owned or owned & {id(p) for model in self.prepared.models for p in model.parameters()}:
            return
        covered: set[int] = set()
        for obj in [*objects, *(prepared.optimizer for prepared in self.prepared.optimizers)]:
            if isinstance(obj, torch.optim.Optimizer):
                covered |= optimizer_parameter_ids(obj)
        untrained = [record for ids, record in originals if ids and not ids & covered]
        if not untrained:
            return
        names = ", ".join(type(record.module).__name__ for record in untrained)
        raise ValueError(
            f"The optimizer {type(optimizer).__name__} holds none of the parameters of the model(s) prepared with it, "
            f"and no optimizer holds those of {names}: it was built on another model's parameters, so training would "
            "update nothing the prepared model uses. Build it on the model you prepare, e.g. `optimizer = "
            "torch.optim.AdamW(model.parameters())`, and pass both to accelerator.prepare(model, optimizer)."
        )

    def _replaces_parameters(self, originals: list[tuple[set[int], PreparedModel]]) -> bool:
        """Whether preparing put new parameter objects in the models (sharding, tensor parallelism)."""
        if self.strategy.replaces_parameters:
            return True
        return any(not ids <= {id(p) for p in record.runs.parameters()} for ids, record in originals)

    def _rebuild_for_wrapped_model(
        self, optimizer: torch.optim.Optimizer, originals: list[tuple[set[int], PreparedModel]]
    ) -> torch.optim.Optimizer:
        owned = optimizer_parameter_ids(optimizer)
        owners = [record for parameter_ids, record in originals if parameter_ids & owned]
        if not owners:
            # Built on a model prepared by an earlier prepare() call: already on the wrapped parameters.
            if owned <= {id(p) for model in self.prepared.models for p in model.parameters()}:
                return optimizer
            raise ValueError(
                f"Preparing the model replaced its parameters ({self.strategy.name}, tensor parallelism): pass the "
                "model to the same prepare() call as its optimizer, or prepare the model first and build the "
                "optimizer on it."
            )
        owner = owners[0]
        if owner.pipeline is not None:
            from ..pipelining.optimizer import rebuild_for_stages

            return rebuild_for_stages(optimizer, owner.pipeline, self._parameter_names)
        return self.strategy.rebuild_optimizer(optimizer, owner.runs, self._parameter_names)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Runs ``model`` through the strategy's chain (``Strategy.parallelize``), with autocast when mixed precision is
        on; returns what the script runs.

        evaluation_mode: the model is only run forward (TRL's reference model): as in the reference, it gets the
        precision and ``torch.compile`` of the whole model (by region with ``use_regional_compilation``; not block by
        block) but is not wrapped for training (no DDP, FSDP or engine; ``Strategy.prepare_eval_model``), nor split
        (``Strategy.prepare_for_evaluation``).
        """
        earlier = self._prepared_before(model)
        if earlier is not None:
            return earlier
        return self._prepare_record(model, device_placement, evaluation_mode).runs

    def _prepare_record(
        self, model: torch.nn.Module, device_placement: bool | None, evaluation_mode: bool = False
    ) -> PreparedModel:
        """Prepares ``model`` and makes its one record: split into pipeline stages first with ``pp_size > 1`` (each
        stage through the strategy's chain), else through the chain whole; autocast inside what runs forward."""
        if device_placement is None:
            device_placement = self.device_placement
        placement = device_placement
        strategy = self.strategy
        self._parameter_names.record(model)
        if evaluation_mode:
            record = PreparedModel.made(model, strategy.prepare_for_evaluation(model, placement))
        elif self._context.dims.config.pp_enabled and not strategy.splits_model_itself:
            from ..pipelining import prepare_pipeline

            pipeline = prepare_pipeline(model, self._context, lambda stage: strategy.parallelize(stage, placement))
            record = PreparedModel.split(model, pipeline)
        else:
            record = PreparedModel.made(model, strategy.parallelize(model, placement))
        for module in record.forward_modules:  # autocast inside each stage, not around the schedule
            self.precision.wrap_forward(module)
        self.prepared.records.append(record)
        return record

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wraps an optimizer so it only steps at accumulation boundaries, through the scaler if any."""
        earlier = self._prepared_before(optimizer)
        if earlier is not None:
            return earlier
        if device_placement is None:
            device_placement = self.device_placement
        reduce = self.strategy.reduce_gradients if isinstance(self.strategy, ReducesGradients) else None
        prepared = AcceleratedOptimizer(
            optimizer, self.precision, self._context.device if device_placement else None, reduce_gradients=reduce
        )
        prepared.guard = self._nonfinite_guard
        prepared.on_step = self._optimizer_stepped
        self.prepared.optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        """Wraps an LR scheduler so it steps with the optimizer, ``scheduler_steps_per_optimizer_step``
        times per real optimizer step (see ``accel_core.scheduler``)."""
        earlier = self._prepared_before(scheduler)
        if earlier is not None:
            return earlier
        optimizers = [opt for opt in self.prepared.optimizers if opt.optimizer is getattr(scheduler, "optimizer", None)]
        prepared = AcceleratedScheduler(
            scheduler,
            optimizers or list(self.prepared.optimizers),
            self.step_scheduler_with_optimizer,
            split_batches=self._dataloader_config.split_batches,
            steps_per_optimizer_step=self.scheduler_steps_per_optimizer_step,
        )
        self.prepared.schedulers.append(prepared)
        return prepared

    @property
    def scheduler_steps_per_optimizer_step(self) -> int:
        """LR scheduler steps per optimizer step (``scheduler_steps_per_optimizer_step`` of the settings)."""
        return scheduler_steps_for(
            self.scheduler_stepping, self._dataloader_config, self._context.dims.config.data_parallel_size
        )

    def prepare_data_loader(self, data_loader: Any, device_placement: bool | None = None) -> Any:
        """Shards a DataLoader over the mesh's data-parallel processes (accel-data); tensor- and
        context-parallel peers read the same batches."""
        earlier = self._prepared_before(data_loader)
        if earlier is not None:
            return earlier
        if device_placement is None:
            device_placement = self.device_placement
        transfer = self.strategy if isinstance(self.strategy, BatchTransfer) else None
        # A strategy with its own device loader moves the batches itself: the loader leaves them on the CPU.
        preparer = discovery.load("accel.preparers", "dataloader")
        # The loader calls this Accelerator's hook at each step boundary (periodic checkpoints); a device loader
        # wrapping it takes the hook over (protocols.ReportsBatchBoundaries).
        prepared = preparer.prepare(
            data_loader, self._data_accelerator, device_placement and transfer is None, self._boundary_hook
        )
        if transfer is not None and device_placement:
            prepared = transfer.wrap_dataloader(prepared)
        self.prepared.dataloaders.append(prepared)
        self.strategy.dataloader_prepared(data_loader)
        return prepared

    def register_for_checkpointing(self, objects: Sequence[Any]) -> None:
        """Adds objects with ``state_dict`` / ``load_state_dict`` to what ``save_state`` saves."""
        invalid = [o for o in objects if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))]
        if invalid:
            listed = "\n".join(f"\t- item {i}: {type(o).__name__}" for i, o in enumerate(invalid))
            raise ValueError(
                "All objects must have `state_dict` and `load_state_dict` methods to be checkpointed. Invalid:\n"
                + listed
            )
        self.prepared.custom_objects.extend(objects)
        self._after_prepare()

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that starts ``num_batches`` in, without reading the skipped samples (for resuming)."""
        return discovery.load("accel.preparers", "dataloader").skip_first_batches(dataloader, num_batches)


def _check_same_device(optimizer: torch.optim.Optimizer, models: list[torch.nn.Module]) -> None:
    """The reference's error for an optimizer built on the model's parameters before the script moved the model to
    another device (on XLA, moving creates new parameters: the optimizer would train nothing)."""
    optimizer_device = next((p.device for group in optimizer.param_groups for p in group["params"]), None)
    model_device = next((p.device for model in models for p in model.parameters()), None)
    if optimizer_device is not None and model_device is not None and optimizer_device != model_device:
        raise ValueError(
            "The model and the optimizer parameters are not on the same device, which probably means you "
            "created an optimizer around your model **before** putting on the device. Make sure the line "
            "model.to(device) is before the optimizer creation in your script or remove it entirely and use "
            "the flag default value for `device_placement` in your `Accelerator` to let it handle that "
            "part for you."
        )
