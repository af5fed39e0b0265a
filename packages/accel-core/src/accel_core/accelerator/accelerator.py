"""The Accelerator: the four-line change that makes a training script run anywhere.

It decides a plan (``strategies.selection``), builds a Strategy, asks it for the job's layout,
builds the one named device mesh (``mesh``) and a Precision, hands the strategy a narrow
``StrategyContext``, then delegates: no backend is named here. ``prepare`` and the transform chain
live in ``preparation``, the mesh's public face in ``parallel``, process control in
``process_control``, tracking and checkpoints in ``services``, evaluation across processes in
``metrics_gathering``. What was prepared is in
``accelerator.prepared`` (``PreparedObjects``; also under the reference's ``_models`` & co).

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
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .. import cluster_env
from .. import environment as env
from ..configuration import (
    AutocastKwargs,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from ..enums import DistributedType, SchedulerStepping
from ..optimizer import AcceleratedOptimizer
from ..optimizer_rebuild import ParameterNames
from ..parallel.config import ParallelismConfig
from ..parallel.dims import ParallelDims, make_dims
from ..precision.modes import AutocastPrecision, PrecisionContext, unwrap_forward
from ..random import synchronize_rng_states
from ..scheduler import AcceleratedScheduler
from ..state import AcceleratorSetup, AcceleratorState, GradientState, PartialState, collective_timeout
from ..strategies import (
    BackwardSyncControl,
    PreparedObjects,
    Strategy,
    StrategyContext,
    create_strategy,
    resolve_strategy_plan,
)
from ..strategies.groups import coordination_group
from ..strategies.selection import PLUGIN_ARGUMENTS
from .arguments import dynamo_settings, index_handlers, one_deepspeed_plugin
from .checkpoint_and_tracking import Checkpointing, Tracking, normalize_log_with
from .metrics_gathering import MetricsGathering
from .nonfinite_guard import NonFiniteGuard
from .parallel_layout import Parallelism
from .preparation import Preparation
from .process_control import ProcessControl
from .profiling import Profiling
from .resumption import Resumption
from .setup_queries import SetupQueries
from .triggers import Triggers

if TYPE_CHECKING:
    from ..protocols import CheckpointAccelerator, DataAccelerator


class Accelerator(
    Preparation,
    Parallelism,
    ProcessControl,
    Tracking,
    Checkpointing,
    Resumption,
    Triggers,
    Profiling,
    SetupQueries,
    MetricsGathering,
):
    """Prepares a model, optimizer, scheduler and dataloaders for the current setup, then stays out of the way.

    Arguments follow the reference ``Accelerator``; accel adds ``strategy`` (a strategy name such
    as ``"ddp"``, or a Strategy object) and ``scheduler_stepping``: ``"per_process"`` (the default,
    as Accelerate: each optimizer step advances a prepared LR scheduler once per data-parallel
    process, once with ``split_batches``) or ``"per_optimizer_step"`` (once; see
    ``accel_core.scheduler``). ``gradient_accumulation_steps`` (left at 1), ``mixed_precision``,
    ``scheduler_stepping`` and the sizes of ``parallelism_config`` default to the ``ACCEL_*``
    environment that ``accel launch`` writes, then to 1, ``"no"``, ``"per_process"`` and all
    processes data-parallel. ``skip_nonfinite=True`` (or ``ACCEL_SKIP_NONFINITE=1``) skips the
    optimizer and scheduler step on every process when any process's loss or any gradient is not
    finite, counting the skips in ``nonfinite_skips`` (``accel_core.accelerator.nonfinite_guard``).
    ``deepspeed_plugins`` takes one plugin, or a dict naming one (accel
    runs one DeepSpeed configuration per Accelerator).

    ``resume="auto"`` (accel's; default from ``ACCEL_AUTO_RESUME``, which ``accel launch
    --auto-resume`` sets) continues from the newest complete automatic checkpoint of
    ``project_config`` once everything it holds is prepared again (see ``accel_core.accelerator.resumption``);
    ``resumed_from`` is its folder (None on a fresh start) and ``completed_steps`` counts optimizer steps.

    One named ``DeviceMesh`` per job (``device_mesh``) is built from ``parallelism_config``;
    dataloaders shard over its ``dp``, and models go through the transform chain of
    ``accel_core.transforms`` (tensor parallel, activation checkpointing, compile, then FSDP2 /
    DDP over the data-parallel dimensions).
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool = False,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = 1,
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
        parallelism_config: ParallelismConfig | None = None,
        strategy: str | Strategy | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        scheduler_stepping: str | SchedulerStepping | None = None,
        resume: str | None = None,
        skip_nonfinite: bool | None = None,
    ) -> None:
        self.project_configuration = project_config if project_config is not None else ProjectConfiguration()
        if project_dir is not None and self.project_configuration.project_dir is None:
            self.project_configuration.set_directories(project_dir)

        self.handlers = index_handlers(kwargs_handlers)
        deepspeed_plugin = one_deepspeed_plugin(deepspeed_plugin, deepspeed_plugins)
        dynamo = dynamo_settings(dynamo_backend, dynamo_plugin)
        if parallelism_config is not None and not isinstance(parallelism_config, ParallelismConfig):
            raise TypeError(
                f"parallelism_config must be an accel ParallelismConfig, got {type(parallelism_config).__name__}."
            )
        if strategy is not None and not isinstance(strategy, (str, Strategy)):
            raise TypeError(
                f'strategy must be a strategy name ("ddp", "fsdp", ...) or an accel_core Strategy instance, got '
                f"{type(strategy).__name__}: subclass accel_core.strategies.Strategy."
            )
        strategy_name = strategy.name if isinstance(strategy, Strategy) else strategy
        cluster_env.adopt()  # started by srun / mpirun / a PyTorchJob: their variables as torchrun's
        world_size = env.get_int(env.WORLD_SIZE, 1) or 1
        plan = resolve_strategy_plan(
            world_size=world_size,
            mixed_precision=None if mixed_precision is None else str(mixed_precision),
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin,
            cpu=cpu,
            plugins={
                "deepspeed_plugin": deepspeed_plugin,
                "fsdp_plugin": fsdp_plugin,
                "megatron_lm_plugin": megatron_lm_plugin,
            },
            strategy=strategy_name,
            dynamo_backend=None if dynamo is None else dynamo.backend.value,
            scheduler_stepping=None if scheduler_stepping is None else str(scheduler_stepping),
            environ=os.environ,
            parallelism=parallelism_config,
        )
        self.plan = plan
        self.dynamo_plugin = dynamo if dynamo is not None else TorchDynamoPlugin(backend=plan.dynamo_backend)
        self.strategy: Strategy = (
            strategy
            if isinstance(strategy, Strategy)
            else create_strategy(plan.strategy, plan.strategy_plugin, self.handlers)
        )
        # Decided before any communication: a layout the strategy refuses fails on every process alike.
        local_world = env.get_int(env.LOCAL_WORLD_SIZE, world_size) or world_size
        layout, given_mesh = self.strategy.parallelism(parallelism_config, world_size, local_world)
        init_kwargs = (
            self.handlers[InitProcessGroupKwargs].to_kwargs() if InitProcessGroupKwargs in self.handlers else {}
        )
        if os.environ.get(env.COLLECTIVE_TIMEOUT):  # --collective-timeout reaches a backend's own group too
            init_kwargs["timeout"] = collective_timeout(init_kwargs.get("timeout"))
        # The stall report's threshold is the process state's, not an argument of the backend's group.
        placement = self.strategy.setup_environment(
            **{k: v for k, v in init_kwargs.items() if k != "stall_report_after"}
        )
        self._state = AcceleratorState(
            mixed_precision=plan.mixed_precision, cpu=plan.cpu, placement=placement, **init_kwargs
        )
        self._state_resets = PartialState._resets
        if placement is not None and self.state.device != placement.device:
            raise ValueError(
                f"The process state already exists on {self.state.device} (a PartialState made before this "
                f"Accelerator), but the {self.strategy.name} strategy places this process on {placement.device}: "
                "create the Accelerator first."
            )
        self.parallel_dims: ParallelDims = make_dims(
            layout,
            self.state.device.type,
            self.state.num_processes,
            self.state.process_index,
            given_mesh,
            dist.is_initialized(),
        )
        if plan.mixed_precision not in self.strategy.supported_precisions:
            raise ValueError(
                f"mixed_precision={plan.mixed_precision!r} is not supported by the {self.strategy.name} strategy; "
                f"use one of {list(self.strategy.supported_precisions)}."
            )
        self.precision = self.strategy.make_precision(
            plan.mixed_precision, PrecisionContext(self.state.device, self.handlers, self.state.is_main_process)
        )
        # What runs: DeepSpeed's config may settle another mode, fp8 on a device without it falls back.
        self.state.mixed_precision = self.precision.name
        self.gradient_state = GradientState(plan.gradient_accumulation)
        self.prepared = PreparedObjects()
        self.device_placement = device_placement
        if dataloader_config is None:
            dataloader_config = DataLoaderConfiguration(
                split_batches=split_batches, dispatch_batches=dispatch_batches, even_batches=even_batches
            )
        elif (split_batches, dispatch_batches, even_batches) != (False, None, True):
            raise ValueError(
                "Pass split_batches / dispatch_batches / even_batches either directly or inside dataloader_config, not "
                "both."
            )
        self.dataloader_config = dataloader_config
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.scheduler_stepping = SchedulerStepping(plan.scheduler_stepping)
        self._parameter_names = ParameterNames()
        self._nonfinite_guard = self._make_nonfinite_guard(skip_nonfinite)
        self._context = StrategyContext(
            device=self.state.device,
            state=self.state,
            dims=self.parallel_dims,
            precision=self.precision,
            plan=plan,
            gradient_state=self.gradient_state,
            prepared=self.prepared,
            handlers=self.handlers,
            device_placement=device_placement,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            scheduler_steps_per_optimizer_step=self.scheduler_steps_per_optimizer_step,
            dynamo_plugin=self.dynamo_plugin,
        )
        self.strategy.setup(self._context)
        if self.state.collectives is None:  # torch.distributed's processes (a backend's own runtime aside)
            # Collective, at the same point on every process: a gloo network problem fails here, not at the first save.
            coordination_group()
        plugin_of = {
            arg: self.strategy.plugin if name == self.strategy.name else None for arg, name in PLUGIN_ARGUMENTS.items()
        }
        setup = AcceleratorSetup(
            dynamo_plugin=self.dynamo_plugin,
            parallelism_config=self.parallel_dims.config,
            device_mesh=self.parallel_dims.mesh,
            # as given (a dict naming the plugin), else the strategy's plugin, as the reference keeps it
            deepspeed_plugins=deepspeed_plugins
            if isinstance(deepspeed_plugins, Mapping)
            else plugin_of["deepspeed_plugin"],
        )
        self.state.record_choice(self.strategy.distributed_type, plugin_of, setup)

        self.rng_types = [str(r) for r in rng_types] if rng_types is not None else ["generator"]
        self.log_with = normalize_log_with(log_with)
        self.trackers: list[Any] = []

        self.step = 0
        self._save_model_state_pre_hook: OrderedDict[int, Any] = OrderedDict()
        self._load_model_state_pre_hook: OrderedDict[int, Any] = OrderedDict()
        self._setup_resumption(resume)

    @property
    def state(self) -> AcceleratorState:  # pyright: ignore[reportIncompatibleVariableOverride]  # the mixins declare it; a checked property here
        """The process's ``AcceleratorState``. Refuses once the state was reset (``AcceleratorState._reset_state()``
        or ``PartialState._reset_state()``) after this Accelerator was made, as the reference does: what it set
        up no longer describes the process."""
        if PartialState._resets != self._state_resets:
            raise RuntimeError(
                "This Accelerator was created before `AcceleratorState._reset_state()` (or "
                "`PartialState._reset_state()`) was called: the state it set up is gone. Create a new `Accelerator()` "
                "after resetting the state, and use that one."
            )
        return self._state

    def _make_nonfinite_guard(self, skip_nonfinite: bool | None) -> NonFiniteGuard | None:
        if skip_nonfinite is None:
            skip_nonfinite = env.flag("ACCEL_SKIP_NONFINITE")
        if not skip_nonfinite:
            return None
        if self.strategy.owns_optimizer_step:
            raise ValueError(
                f"skip_nonfinite=True needs accel to step the optimizer, but the {self.strategy.name} strategy steps "
                "it itself (its own loss scaler skips inf/NaN steps): leave skip_nonfinite off."
            )
        return NonFiniteGuard(
            self.prepared.optimizers, self.state.device, check_gradients=self.precision.scaler is None
        )

    # -- the prepared objects, under the reference API's names ------------------------------
    @property
    def _models(self) -> list[torch.nn.Module]:
        return self.prepared.models

    @property
    def _optimizers(self) -> list[AcceleratedOptimizer]:
        return self.prepared.optimizers

    @property
    def _schedulers(self) -> list[AcceleratedScheduler]:
        return self.prepared.schedulers

    @property
    def _dataloaders(self) -> list[Any]:
        return self.prepared.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self.prepared.custom_objects

    # -- properties -------------------------------------------------------------------------
    @property
    def distributed_type(self) -> DistributedType:
        """How the processes train together, as the strategy reports it."""
        return self.strategy.distributed_type

    @property
    def mixed_precision(self) -> str:
        """The precision mode in use: "no", "fp16", "bf16" or "fp8" (an old GPU asked for fp8 runs fp16)."""
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
    def nonfinite_skips(self) -> int:
        """How many optimizer steps ``skip_nonfinite`` skipped (0 when it is off)."""
        return 0 if self._nonfinite_guard is None else self._nonfinite_guard.skips

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 inf/nan gradients): do not change the LR then."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    # -- the training step ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Use instead of ``loss.backward()``: divides by the accumulation steps and applies the loss scale."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"accelerator.backward(loss) needs the loss tensor the model's output produced, got "
                f"{type(loss).__name__} {loss!r}: pass the tensor itself, before .item() or float(), e.g. "
                "`loss = loss_fn(model(inputs), targets); accelerator.backward(loss)`."
            )
        owns_step = self.strategy.owns_optimizer_step
        if not owns_step and self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        if self._nonfinite_guard is not None:
            self._nonfinite_guard.observe_loss(loss)
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
        self._accumulate_boundary()
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
        optimizers = (
            self._optimizers
            if optimizer is None
            else optimizer
            if isinstance(optimizer, (list, tuple))
            else [optimizer]
        )
        for opt in optimizers:
            while isinstance(opt, AcceleratedOptimizer):
                opt = opt.optimizer
            self.precision.unscale_(opt)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
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
        """The full state dict of a prepared model (gathered where the strategy shards it, and over the pipeline
        stages: valid on the main process), fp16 cast to fp32."""
        from ..pipelining import StagedModel

        if isinstance(model, StagedModel):
            state_dict = model.full_state_dict() if unwrap else model.state_dict()
        else:
            state_dict = self.strategy.model_state_dict(model) if unwrap else model.state_dict()
        return {
            k: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v
            for k, v in state_dict.items()
        }

    def synchronize_rng_states(self, generator: torch.Generator | None = None) -> None:
        """Copies process 0's RNG states (``rng_types``) to every process."""
        synchronize_rng_states([r for r in self.rng_types if r != "generator" or generator is not None], generator)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drops references to everything prepared and empties device caches (between two trainings)."""
        self.wait_for_checkpoint()
        self.prepared.clear()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None] * len(objects)

    def clear(self, *objects: Any) -> list[None]:
        """Same as ``free_memory``."""
        return self.free_memory(*objects)

    def __deepcopy__(self, memo: dict[int, Any]) -> Accelerator:
        # As in the reference: an Accelerator stands for the job (its process group, mesh and
        # prepared objects), so a deep copy is the same object.
        return self

    def __repr__(self) -> str:
        return (
            f"Accelerator(strategy={self.strategy.name}, processes={self.num_processes}, "
            f"layout=({self.parallel_dims.config.describe()}), device={self.device}, "
            f"mixed_precision={self.mixed_precision}, gradient_accumulation_steps={self.gradient_accumulation_steps})"
        )


if TYPE_CHECKING:
    # The Accelerator answers the contracts of the packages it hands itself to (checked by pyright).
    def _answers_the_package_contracts(accelerator: Accelerator) -> tuple[DataAccelerator, CheckpointAccelerator]:
        return accelerator, accelerator
