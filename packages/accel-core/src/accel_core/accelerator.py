"""The Accelerator: the four-line change that makes a training script run anywhere.

It decides a plan (``strategies.selection``), builds a Strategy and a Precision, then delegates:
no backend is named here. Process control lives in ``process_control``, tracking and checkpoints
in ``services``.

Example::

    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib
import gc
import os
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from . import environment as env
from . import ops, plugins
from .arguments import dynamo_settings, index_handlers, one_deepspeed_plugin
from .compilation import compile_model
from .configuration import (
    AutocastKwargs,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from .enums import DistributedType, SchedulerStepping
from .optimizer import AcceleratedOptimizer
from .precision import AutocastPrecision, Precision, unwrap_forward
from .process_control import ProcessControl
from .profiling import Profiling
from .queries import SetupQueries
from .random import synchronize_rng_states
from .scheduler import AcceleratedScheduler
from .services import Checkpointing, Tracking, normalize_log_with
from .state import AcceleratorState, GradientState
from .strategies import (
    BackwardSyncControl,
    JointPreparation,
    OwnsOptimizerStep,
    ProcessGroupSetup,
    WrapsBeforeOptimizer,
    create_strategy,
    resolve_plan,
)
from .strategies.base import ConvertsOwnTypes, PreparesOwnTypes
from .triggers import Triggers

_SUPPORTED = "torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler and torch.utils.data.DataLoader"


class Accelerator(ProcessControl, Tracking, Checkpointing, Triggers, Profiling, SetupQueries):
    """Prepares a model, optimizer, scheduler and dataloaders for the current setup, then stays out of the way.

    Arguments follow the reference ``Accelerator``; accel adds ``strategy`` (a strategy name such as
    ``"ddp"``, or a Strategy) and ``scheduler_stepping``: ``"per_process"`` (the default, as
    Accelerate: each optimizer step advances a prepared LR scheduler once per data-parallel process,
    once with ``split_batches``) or ``"per_optimizer_step"`` (once; see ``accel_core.scheduler``).
    ``gradient_accumulation_steps``, ``mixed_precision`` and ``scheduler_stepping`` default to the
    ``ACCEL_*`` environment that ``accel launch`` writes, then to 1, ``"no"`` and ``"per_process"``.
    ``deepspeed_plugins`` takes one plugin, or a dict naming one (accel runs one DeepSpeed
    configuration per Accelerator).
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        cpu: bool = False,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        dispatch_batches: bool | None = None,
        even_batches: bool = True,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dataloader_config: DataLoaderConfiguration | None = None,
        strategy: Any = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        scheduler_stepping: str | SchedulerStepping | None = None,
    ) -> None:
        self.project_configuration = project_config if project_config is not None else ProjectConfiguration()
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)

        self.handlers = index_handlers(kwargs_handlers)
        deepspeed_plugin = one_deepspeed_plugin(deepspeed_plugin, deepspeed_plugins)
        dynamo = dynamo_settings(dynamo_backend, dynamo_plugin)
        strategy_name = strategy if isinstance(strategy, str) or strategy is None else getattr(strategy, "name", None)
        plan = resolve_plan(
            world_size=env.get_int(env.WORLD_SIZE, 1) or 1,
            mixed_precision=None if mixed_precision is None else str(mixed_precision),
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin,
            cpu=cpu,
            plugins={"deepspeed_plugin": deepspeed_plugin, "fsdp_plugin": fsdp_plugin, "megatron_lm_plugin": megatron_lm_plugin},
            strategy=strategy_name,
            dynamo_backend=None if dynamo is None else dynamo.backend.value,
            scheduler_stepping=None if scheduler_stepping is None else str(scheduler_stepping),
            environ=os.environ,
        )
        self.plan = plan
        self.dynamo_plugin = dynamo if dynamo is not None else TorchDynamoPlugin(backend=plan.dynamo_backend)
        self.strategy = strategy if strategy is not None and not isinstance(strategy, str) else create_strategy(
            plan.strategy, plan.strategy_plugin, self.handlers
        )
        init_kwargs = self.handlers[InitProcessGroupKwargs].to_kwargs() if InitProcessGroupKwargs in self.handlers else {}
        if isinstance(self.strategy, ProcessGroupSetup):
            self.strategy.init_process_group(**init_kwargs)
        self.state = AcceleratorState(mixed_precision=plan.mixed_precision, cpu=plan.cpu, **init_kwargs)
        self.state._shared_state["strategy"] = self.strategy
        self.strategy.setup(self)
        self.precision = self._make_precision(plan.mixed_precision)
        self.gradient_state = GradientState(plan.gradient_accumulation)

        if dataloader_config is None:
            dataloader_config = DataLoaderConfiguration(
                split_batches=split_batches, dispatch_batches=dispatch_batches, even_batches=even_batches
            )
        elif (split_batches, dispatch_batches, even_batches) != (False, None, True):
            raise ValueError(
                "Pass split_batches / dispatch_batches / even_batches either directly or inside dataloader_config, not both."
            )
        self.dataloader_config = dataloader_config
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.scheduler_stepping = SchedulerStepping(plan.scheduler_stepping)
        self.rng_types = [str(r) for r in rng_types] if rng_types is not None else ["generator"]
        self.log_with = normalize_log_with(log_with)
        self.trackers: list[Any] = []

        self.step = 0
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[AcceleratedOptimizer] = []
        self._schedulers: list[AcceleratedScheduler] = []
        self._dataloaders: list[Any] = []
        self._custom_objects: list[Any] = []
        self._save_model_state_pre_hook: OrderedDict[int, Any] = OrderedDict()
        self._load_model_state_pre_hook: OrderedDict[int, Any] = OrderedDict()

    def _make_precision(self, name: str) -> Precision:
        if name not in self.strategy.supported_precisions:
            raise ValueError(
                f"mixed_precision={name!r} is not supported by the {self.strategy.name} strategy; "
                f"use one of {list(self.strategy.supported_precisions)}."
            )
        if name == "fp8":
            return plugins.load("accel.precisions", "fp8")(self)
        if self.strategy.owns_precision:
            # The backend applies it (and may settle it from its own config, e.g. DeepSpeed's bf16 section).
            return Precision(getattr(self.strategy, "mixed_precision", name))
        if name == "no":
            return Precision()
        device = self.state.device
        if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ValueError("bf16 mixed precision needs a GPU that supports bfloat16 (Ampere or newer): use fp16.")
        scaler = None
        if name == "fp16":
            scaler_kwargs = self.handlers[GradScalerKwargs].to_kwargs() if GradScalerKwargs in self.handlers else {}
            scaler = self.strategy.make_grad_scaler(**scaler_kwargs)
        autocast_kwargs = self.handlers[AutocastKwargs].to_kwargs() if AutocastKwargs in self.handlers else {}
        return AutocastPrecision(name, device.type, scaler=scaler, autocast_kwargs=autocast_kwargs)

    # -- properties -------------------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:
        """How the processes train together, as the strategy reports it."""
        return self.strategy.distributed_type

    @property
    def mixed_precision(self) -> str:
        """The precision mode in use: "no", "fp16" or "bf16"."""
        return self.precision.name

    @property
    def use_fp16(self) -> bool:
        """Whether mixed precision is on (any mode, as in the reference API); prefer ``mixed_precision``."""
        return self.mixed_precision != "no"

    @property
    def scaler(self) -> Any:
        """The fp16 ``GradScaler`` (or the strategy's sharded one), else None."""
        return self.precision.scaler

    @property
    def native_amp(self) -> bool:
        """Whether precision runs through ``torch.autocast`` (bf16 or fp16)."""
        return isinstance(self.precision, AutocastPrecision)

    @property
    def split_batches(self) -> bool:
        """``DataLoaderConfiguration.split_batches``: batches are cut between processes."""
        return self.dataloader_config.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        """``DataLoaderConfiguration.dispatch_batches``: process 0 reads and sends the batches."""
        return self.dataloader_config.dispatch_batches

    @property
    def even_batches(self) -> bool:
        """``DataLoaderConfiguration.even_batches``: every process gets as many batches."""
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def sync_gradients(self) -> bool:
        """Whether this step synchronises gradients (the last micro-step of an accumulation)."""
        return self.gradient_state.sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        """The number of micro-steps per optimizer step."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        # Scripts that search for a batch size that fits (find_executable_batch_size) set it afterwards.
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {value!r}.")
        self.gradient_state.num_steps = value

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 inf/nan gradients): do not change the LR then."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    # -- prepare ----------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: Sequence[bool | None] | None = None) -> Any:
        """Prepares models, optimizers, schedulers and dataloaders; returns them in the order given.

        device_placement: one bool (or None for the default) per object.
        """
        if device_placement is None:
            device_placement = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"`device_placement` should be a list with {len(args)} elements (the number of objects passed), "
                f"got {len(device_placement)}."
            )
        own_types = self.strategy.accepts_object if isinstance(self.strategy, PreparesOwnTypes) else None
        for obj in args:
            if not isinstance(obj, (torch.nn.Module, torch.optim.Optimizer, LRScheduler, torch.utils.data.DataLoader)) and not (
                own_types is not None and own_types(obj)
            ):
                raise TypeError(
                    f"Cannot prepare an object of type {type(obj).__name__}: prepare accepts {_SUPPORTED}. "
                    "Leave other objects out of prepare()."
                )
        result: list[Any] = list(args)
        # Dataloaders first: a joint preparation (DeepSpeed) needs their batch size.
        for i, obj in enumerate(args):
            if isinstance(obj, torch.utils.data.DataLoader):
                result[i] = self.prepare_data_loader(obj, device_placement=device_placement[i])
        if isinstance(self.strategy, JointPreparation):
            result = self.strategy.prepare_jointly(result)
        else:
            if own_types is not None and isinstance(self.strategy, ConvertsOwnTypes):
                result = [self.strategy.convert_object(obj) if own_types(obj) else obj for obj in result]
            result = self._prepare_separately(result, device_placement)
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_separately(self, objects: list[Any], device_placement: Sequence[bool | None]) -> list[Any]:
        # Parameters of each model before wrapping, to find which model an optimizer belongs to.
        originals: list[tuple[set[int], torch.nn.Module]] = []
        for i, obj in enumerate(objects):
            if isinstance(obj, torch.nn.Module):
                parameter_ids = {id(p) for p in obj.parameters()}
                objects[i] = self.prepare_model(obj, device_placement=device_placement[i])
                originals.append((parameter_ids, objects[i]))
        rebuilt: dict[int, torch.optim.Optimizer] = {}
        for i, obj in enumerate(objects):
            if isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, AcceleratedOptimizer):
                if isinstance(self.strategy, WrapsBeforeOptimizer):
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

    def _rebuild_for_wrapped_model(
        self, optimizer: torch.optim.Optimizer, originals: list[tuple[set[int], torch.nn.Module]]
    ) -> torch.optim.Optimizer:
        owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
        owners = [model for parameter_ids, model in originals if parameter_ids & owned]
        if not owners:
            # Built on a model prepared by an earlier prepare() call: already on the wrapped parameters.
            if owned <= {id(p) for model in self._models for p in model.parameters()}:
                return optimizer
            raise ValueError(
                f"The {self.strategy.name} strategy must wrap the model before its optimizer is prepared: pass the model "
                "to the same prepare() call as its optimizer, or prepare the model first and build the optimizer on it."
            )
        return self.strategy.rebuild_optimizer(optimizer, owners[0])  # type: ignore[attr-defined]

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False) -> torch.nn.Module:
        """Places and wraps one model for the current strategy, with autocast when mixed precision is on."""
        if device_placement is None:
            device_placement = self.device_placement
        prepared = self.strategy.prepare_model(model, device_placement=device_placement)
        self.precision.wrap_forward(self.strategy.unwrap_model(prepared))
        prepared = compile_model(prepared, self.dynamo_plugin)
        self._models.append(prepared)
        return prepared

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None) -> AcceleratedOptimizer:
        """Wraps an optimizer so it only steps at accumulation boundaries, through the scaler if any."""
        if device_placement is None:
            device_placement = self.device_placement
        prepared = AcceleratedOptimizer(optimizer, self.precision, self.state.device if device_placement else None)
        self._optimizers.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        """Wraps an LR scheduler so it steps with the optimizer, ``scheduler_steps_per_optimizer_step``
        times per real optimizer step (see ``accel_core.scheduler``)."""
        optimizers = [opt for opt in self._optimizers if opt.optimizer is getattr(scheduler, "optimizer", None)]
        prepared = AcceleratedScheduler(
            scheduler,
            optimizers or list(self._optimizers),
            self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
            steps_per_optimizer_step=self.scheduler_steps_per_optimizer_step,
        )
        self._schedulers.append(prepared)
        return prepared

    @property
    def scheduler_steps_per_optimizer_step(self) -> int:
        """LR scheduler steps per optimizer step: the data-parallel size (1 with ``split_batches``) with
        ``scheduler_stepping="per_process"``, 1 with ``"per_optimizer_step"``."""
        if self.scheduler_stepping == SchedulerStepping.PER_OPTIMIZER_STEP or self.split_batches:
            return 1
        return self.strategy.data_parallel_size

    def prepare_data_loader(self, data_loader: Any, device_placement: bool | None = None) -> Any:
        """Shards a DataLoader over the data-parallel processes (accel-data)."""
        if device_placement is None:
            device_placement = self.device_placement
        prepared = plugins.load("accel.preparers", "dataloader").prepare(data_loader, self, device_placement)
        self._dataloaders.append(prepared)
        return prepared

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that starts ``num_batches`` in, without reading the skipped samples (for resuming)."""
        return plugins.load("accel.preparers", "dataloader").skip_first_batches(dataloader, num_batches)

    # -- the training step ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Use instead of ``loss.backward()``: divides by the accumulation steps and applies the loss scale."""
        owns_step = isinstance(self.strategy, OwnsOptimizerStep) and self.strategy.owns_optimizer_step()
        if not owns_step and self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        self.strategy.backward(self.precision.scale_loss(loss), **kwargs)

    def _do_sync(self) -> None:
        if self.gradient_state.sync_with_dataloader and self.gradient_state.end_of_dataloader:
            self.step = 0
            self.gradient_state._set_sync_gradients(True)
        else:
            self.step += 1
            self.gradient_state._set_sync_gradients(self.step % self.gradient_state.num_steps == 0)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Wrap each micro-batch: gradients sync (and the optimizer steps) every ``gradient_accumulation_steps``
        micro-batches and on the last batch of the data."""
        self._do_sync()
        with contextlib.ExitStack() as stack:
            if not (self.sync_gradients or self.gradient_state.sync_each_batch):
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skips gradient synchronisation inside the block (where the strategy can)."""
        if self.use_distributed and isinstance(self.strategy, BackwardSyncControl):
            with self.strategy.no_sync(model):
                yield
        else:
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divides gradients by the fp16 loss scale (done for you by ``clip_grad_norm_``)."""
        optimizers = self._optimizers if optimizer is None else optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
        for opt in optimizers:
            while isinstance(opt, AcceleratedOptimizer):
                opt = opt.optimizer
            self.precision.unscale_(opt)

    def clip_grad_norm_(self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """Use instead of ``torch.nn.utils.clip_grad_norm_``; returns the total (global) gradient norm."""
        parameters = list(parameters)
        if self.sync_gradients:
            self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        """Use instead of ``torch.nn.utils.clip_grad_value_``."""
        parameters = list(parameters)
        if self.sync_gradients:
            self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Autocast for code outside the prepared model's forward (a loss computed separately, say)."""
        kwargs = autocast_handler.to_kwargs() if autocast_handler is not None else {}
        return self.precision.autocast(**kwargs)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gathers predictions or labels for a metric, dropping the samples repeated to even out the last batch.

        Tensors are gathered as tensors; lists of Python objects (strings, say) are concatenated
        across processes; dicts and tuples are gathered leaf by leaf. ``use_gather_object=True``
        gathers the whole input as one picklable object per process instead.
        """
        remainder = self.gradient_state.remainder
        keep = remainder if self.use_distributed and self.gradient_state.end_of_dataloader and remainder > 0 else None
        # Where data is sharded over a data-parallel group smaller than the world (tensor-parallel
        # peers read the same batches), gather over that group: the world would repeat each sample.
        group = self.strategy.data_parallel_group if self.strategy.data_parallel_size != self.num_processes else None
        if use_gather_object:
            data = ops.gather_object(input_data, group)
            return data[:keep] if keep is not None and isinstance(input_data, (list, tuple)) else data
        return _gather_samples(input_data, keep, group)

    # -- models -----------------------------------------------------------------------------
    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's module from inside the strategy's wrapper.

        keep_torch_compile: for a compiled model, return the user's module in a new compiled wrapper
            with the same compile settings (as Accelerate returns; the prepared model is left as it
            is); False returns the plain module.
        """
        compiled = model if "_orig_mod" in model.__dict__.get("_modules", {}) else None
        model = getattr(model, "_orig_mod", model)
        model = self.strategy.unwrap_model(model)
        if not keep_fp32_wrapper:
            unwrap_forward(model)
        if compiled is not None and keep_torch_compile:
            # torch.compile's wrapper class, built around the user's module with the same dynamo context.
            model = type(compiled)(model, compiled.dynamo_ctx)
        return model

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict of a prepared model (gathered where the strategy shards it), fp16 cast to fp32."""
        state_dict = self.strategy.model_state_dict(model) if unwrap else model.state_dict()
        return {k: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v for k, v in state_dict.items()}

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Lets processes with fewer batches finish while the others go on (``torch.distributed.algorithms.Join``).

        even_batches: override the prepared dataloaders' setting inside the block (map-style only).
        """
        from torch.distributed.algorithms.join import Join, Joinable

        if not self.use_distributed:
            yield
            return
        if not all(isinstance(j, Joinable) for j in joinables):
            warnings.warn(
                f"join_uneven_inputs needs Joinable objects (a DDP model); the {self.strategy.name} strategy's are not, "
                "so it has no effect.",
                stacklevel=3,
            )
            yield
            return
        even = self.even_batches if even_batches is None else even_batches
        saved = [(dl, dl.even_batches) for dl in self._dataloaders if hasattr(dl, "even_batches") and not _is_iterable(dl)]
        if even_batches is not None and any(_is_iterable(dl) for dl in self._dataloaders):
            warnings.warn(
                "Overriding even_batches is only supported for map-style datasets, yet some dataloaders given were iterable",
                stacklevel=3,
            )
        try:
            if even_batches is not None:
                for dl, _ in saved:
                    dl.even_batches = even_batches
            with Join(joinables, enable=not even, throw_on_early_termination=False):
                yield
        finally:
            for dl, value in saved:
                dl.even_batches = value

    def synchronize_rng_states(self, generator: torch.Generator | None = None) -> None:
        """Copies process 0's RNG states (``rng_types``) to every process."""
        synchronize_rng_states([r for r in self.rng_types if r != "generator" or generator is not None], generator)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drops references to everything prepared and empties device caches (between two trainings)."""
        self.wait_for_checkpoint()
        self._models, self._optimizers, self._schedulers, self._dataloaders = [], [], [], []
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    def clear(self, *objects: Any) -> list[None]:
        """Same as ``free_memory``."""
        return self.free_memory(*objects)

    def __repr__(self) -> str:
        return (
            f"Accelerator(strategy={self.strategy.name}, processes={self.num_processes}, device={self.device}, "
            f"mixed_precision={self.mixed_precision}, gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )


def _is_iterable(dataloader: Any) -> bool:
    """Whether a prepared loader reads an iterable-style dataset (its even_batches cannot be overridden)."""
    return isinstance(getattr(dataloader, "dataset", None), torch.utils.data.IterableDataset)


def _contains_tensor(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, Mapping):
        return any(_contains_tensor(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return any(_contains_tensor(v) for v in data)
    return False


def _gather_samples(data: Any, keep: int | None, group: Any = None) -> Any:
    """Gathers ``data`` along its sample dimension over ``group``; keeps the first ``keep`` samples when given."""
    if isinstance(data, torch.Tensor):
        gathered = ops.gather(data, group)
        return gathered if keep is None else gathered[:keep]
    if isinstance(data, Mapping):
        return type(data)({k: _gather_samples(v, keep, group) for k, v in data.items()})
    if isinstance(data, (list, tuple)) and _contains_tensor(data):
        return ops.honor_type(data, (_gather_samples(v, keep, group) for v in data))
    gathered = ops.gather_object(data, group)  # a list of samples is concatenated; a lone object listed per process
    return gathered if keep is None or not isinstance(data, (list, tuple)) else gathered[:keep]
