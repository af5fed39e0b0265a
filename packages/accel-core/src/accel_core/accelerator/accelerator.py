"""The Accelerator: the four-line change that makes a training script run anywhere.

Its constructor assembles the run (``assembly``: the plan, the Strategy, the job's layout, the one
named device mesh, the Precision and the ``StrategyContext`` the strategy is set up with), then
creates its parts, each constructed with what it uses, and delegates to
them: ``Preparation`` (``prepare``), ``Resumption`` (auto-resume, ``completed_steps``, periodic
checkpoints), ``Tracking``, ``Checkpointing`` (accel-checkpoint's handler), ``MetricsGathering``
(evaluation across processes), ``ParallelLayout`` (mesh ranks, ``forward_backward``) and a
``Trigger``. Its base classes hold no field: ``TrainingStep`` (``backward``, ``accumulate``, clipping, the
trigger), ``ReferenceProperties`` (the reference API's properties, read from the fields and parts), and the
read-only questions about the run, ``ProcessControl`` and ``SetupQueries``.
No backend is named here. What was prepared is in ``accelerator.prepared`` (``PreparedObjects``;
also under the reference's ``_optimizers`` & co; ``_models`` lists the models as the reference does).

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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.hooks import RemovableHandle

from ..configuration import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    KwargsHandler,
    ProfileKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from ..enums import SchedulerStepping
from ..model_utils import is_compiled_module
from ..optimizer import AcceleratedOptimizer
from ..parallel.config import ParallelismConfig
from ..parallel.dims import ParallelDims
from ..precision.modes import unwrap_forward
from ..random import synchronize_rng_states
from ..scheduler import AcceleratedScheduler
from ..state import AcceleratorState, PartialState, StateResetError
from ..strategies import (
    Strategy,
)
from .arguments import dataloader_settings, index_handlers
from .assembly import RunArguments, assemble
from .checkpointing import Checkpointing
from .metrics_gathering import MetricsGathering
from .nonfinite_guard import NonFiniteGuard
from .parallel_layout import ParallelLayout
from .preparation import Preparation
from .process_control import ProcessControl
from .profiling import profiled
from .reference_properties import ReferenceProperties
from .resumption import Resumption
from .setup_queries import SetupQueries
from .teardown import tear_down_at_exit
from .tracking import Tracking, normalize_log_with
from .training_step import TrainingStep
from .triggers import Trigger

if TYPE_CHECKING:
    from ..protocols import CheckpointAccelerator, DataAccelerator
    from ..settings import RunSettings


class Accelerator(TrainingStep, ReferenceProperties, ProcessControl, SetupQueries):
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

        dataloader_config = dataloader_settings(dataloader_config, split_batches, dispatch_batches, even_batches)
        SetupQueries.__init__(self, index_handlers(kwargs_handlers), dataloader_config)
        run = assemble(
            RunArguments(
                handlers=self.handlers,
                dataloader_config=dataloader_config,
                mixed_precision=mixed_precision,
                gradient_accumulation_steps=gradient_accumulation_steps,
                gradient_accumulation_plugin=gradient_accumulation_plugin,
                cpu=cpu,
                deepspeed_plugin=deepspeed_plugin,
                deepspeed_plugins=deepspeed_plugins,
                fsdp_plugin=fsdp_plugin,
                megatron_lm_plugin=megatron_lm_plugin,
                dynamo_backend=dynamo_backend,
                dynamo_plugin=dynamo_plugin,
                parallelism_config=parallelism_config,
                strategy=strategy,
                scheduler_stepping=scheduler_stepping,
                device_placement=device_placement,
                step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            )
        )
        context = run.context
        self._settings = context.settings
        self.strategy: Strategy = run.strategy
        self.plan = context.plan
        self.dynamo_plugin = context.dynamo_plugin
        self._state = context.state
        self._state_resets = PartialState._resets
        self.parallel_dims: ParallelDims = context.dims
        self.precision = context.precision
        self.gradient_state = context.gradient_state
        self.prepared = context.prepared
        self._nonfinite_guard = self._make_nonfinite_guard(skip_nonfinite, context.settings)

        self.rng_types = [str(r) for r in rng_types] if rng_types is not None else ["generator"]
        self.step = 0  # micro-steps of the current accumulation (saved with checkpoints)

        # The parts, each constructed with what it uses; the methods below delegate to them.
        self._tracking = Tracking(self, self.project_configuration, normalize_log_with(log_with), self._nonfinite_guard)
        self._checkpointing = Checkpointing(self, self, self.project_configuration)
        self._resumption = Resumption(
            resume,
            self.project_configuration,
            self,
            self.gradient_state,
            self.prepared,
            self._checkpointing,
            self._tracking,
            self._nonfinite_guard,
            self.end_training,
            context.settings,
        )
        self._preparation = Preparation(
            self.strategy,
            context,
            self,
            dataloader_config,
            device_placement,
            step_scheduler_with_optimizer,
            run.scheduler_stepping,
            self._nonfinite_guard,
            self._resumption.after_prepare,
            self._resumption.optimizer_stepped,
            self._resumption.boundary_hook,
        )
        self._layout = ParallelLayout(
            self.parallel_dims, self.strategy, self.precision, self.gradient_state, self.backward, self.prepared
        )
        self._metrics = MetricsGathering(
            self, self.gradient_state, self.parallel_dims, self.strategy, self.prepared, dataloader_config
        )
        self._trigger = Trigger(self)
        tear_down_at_exit(self.strategy)  # the strategy's teardown at exit if free_memory() did not run it

    @property
    def state(self) -> AcceleratorState:
        """The process's ``AcceleratorState`` (shared by everything in the process).

        Returned even after the process state was reset (as Accelerate's own test scripts do between cases) once
        this Accelerator was made, as in the reference; while the state is reset, reading one of its fields raises
        an ``AttributeError`` that names the reset. The Accelerator's own methods refuse to work after such a reset
        (``StateResetError``): create a new ``Accelerator()``."""
        return self._state

    @property
    def _current_state(self) -> AcceleratorState:
        """The state, for this Accelerator's methods: refuses once the state was reset after it was made, since what
        it set up no longer describes the process."""
        if PartialState._resets != self._state_resets:
            raise StateResetError(
                "This Accelerator was created before the state was reset: the `AcceleratorState` object has no "
                "attribute it set up any more. This happens if `AcceleratorState._reset_state()` (or "
                "`PartialState._reset_state()`) was called after the Accelerator was made. Create a new "
                "`Accelerator()` after resetting the state, and use that one."
            )
        return self._state

    def _make_nonfinite_guard(self, skip_nonfinite: bool | None, settings: RunSettings) -> NonFiniteGuard | None:
        if skip_nonfinite is None:
            skip_nonfinite = settings.flag("ACCEL_SKIP_NONFINITE")
        if not skip_nonfinite:
            return None
        if self.strategy.owns_optimizer_step:
            raise ValueError(
                f"skip_nonfinite=True needs accel to step the optimizer, but the {self.strategy.name} strategy steps "
                "it itself (its own loss scaler skips inf/NaN steps): leave skip_nonfinite off."
            )
        return NonFiniteGuard(
            self.prepared.optimizers, self._current_state.device, check_gradients=self.precision.scaler is None
        )

    # -- prepare (Preparation) --------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: Sequence[bool | None] | None = None) -> Any:
        """Prepares models, optimizers, schedulers and dataloaders; returns them in the order given.

        device_placement: one bool (or None for the default) per object.
        An object prepared before (the prepared wrapper, or the model, optimizer or scheduler it
        wraps) comes back as the prepared object, registered once (checkpoints count each once).
        """
        _ = self._current_state  # refuses, naming the reset, when the state was reset after this Accelerator was made
        return self._preparation.prepare(*args, device_placement=device_placement)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Runs ``model`` through the transform chain (``accel_core.transforms``), with autocast when mixed precision is
        on.

        evaluation_mode: for a model only run forward (a frozen reference model): it gets mixed precision and
        ``torch.compile`` of the whole model (region by region with ``use_regional_compilation``) and is placed on
        the device, but is not wrapped for training (no DDP, FSDP or DeepSpeed engine), as in the reference.

        Example::

            ref_model = accelerator.prepare_model(ref_model, evaluation_mode=True)
        """
        return self._preparation.prepare_model(model, device_placement, evaluation_mode)

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wraps an optimizer so it only steps at accumulation boundaries, through the scaler if any."""
        return self._preparation.prepare_optimizer(optimizer, device_placement)

    def prepare_scheduler(self, scheduler: LRScheduler) -> AcceleratedScheduler:
        """Wraps an LR scheduler so it steps with the optimizer, ``scheduler_steps_per_optimizer_step``
        times per real optimizer step (see ``accel_core.scheduler``)."""
        return self._preparation.prepare_scheduler(scheduler)

    def prepare_data_loader(self, data_loader: Any, device_placement: bool | None = None) -> Any:
        """Shards a DataLoader over the mesh's data-parallel processes (accel-data); tensor- and
        context-parallel peers read the same batches."""
        return self._preparation.prepare_data_loader(data_loader, device_placement)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader that starts ``num_batches`` in, without reading the skipped samples (for resuming)."""
        return self._preparation.skip_first_batches(dataloader, num_batches)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Adds objects with ``state_dict`` / ``load_state_dict`` to what ``save_state`` saves."""
        self._preparation.register_for_checkpointing(objects)

    # -- the layout (ParallelLayout's steps) ---------------------------------------------------------
    def forward_backward(
        self,
        model: torch.nn.Module,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
    ) -> torch.Tensor:
        """One training micro-step: forward, ``loss_fn(outputs, targets)``, backward; returns the loss (detached).

        inputs: the model's arguments: a tensor (one argument), a tuple (positional arguments) or a
            dict (keyword arguments).
        loss_fn: ``loss_fn(outputs, targets) -> scalar loss``, a mean over the samples of its batch.

        Without pipeline parallelism it is exactly ``loss = loss_fn(model(inputs), targets);
        accelerator.backward(loss)`` (accumulation and precision as there). With ``pp_size > 1`` it
        runs the pipeline schedule over ``pp_microbatches`` micro-batches (the batch size must
        divide) and returns the batch's mean loss on every rank (sent from the last stage). Use it
        inside ``accumulate`` like ``backward``; ``optimizer.step()``, ``clip_grad_norm_`` and the
        scheduler stay as they are.

        Example::

            for inputs, targets in loader:
                with accelerator.accumulate(model):
                    loss = accelerator.forward_backward(model, inputs, targets, torch.nn.functional.cross_entropy)
                    optimizer.step(); scheduler.step(); optimizer.zero_grad()
        """
        return self._layout.forward_backward(model, inputs, targets, loss_fn)

    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """Inside the block, each process of a ``cp`` group holds ``1/cp_size`` of each buffer along its
        sequence dim, and attention (``F.scaled_dot_product_attention``) runs as ring attention over the group.

        Enter it anew at each step. Without context parallelism it does nothing. Needs a GPU for the
        attention itself (see ``accel_core.transforms.context_parallel``).

        Example::

            for batch in loader:
                with accelerator.maybe_context_parallel(buffers=[batch["input_ids"], batch["labels"]],
                                                        buffer_seq_dims=[1, 1]):
                    loss = model(batch["input_ids"], labels=batch["labels"]).loss
                    accelerator.backward(loss)
        """
        return self._layout.maybe_context_parallel(buffers, buffer_seq_dims, no_restore_buffers)

    # -- tracking (Tracking) ----------------------------------------------------------------
    def init_trackers(
        self, project_name: str, config: dict[str, Any] | None = None, init_kwargs: dict[str, Any] | None = None
    ) -> None:
        """Starts the trackers of ``log_with`` (the local tracker when none was named), main process only.

        init_kwargs: per-tracker constructor arguments, ``{"wandb": {"tags": [...]}}``.
        """
        self._tracking.init_trackers(project_name, config, init_kwargs or {})

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its raw library object with ``unwrap=True``)."""
        return self._tracking.get_tracker(name, unwrap)

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None) -> None:
        """Logs ``values`` to every started tracker (main process only).

        With ``skip_nonfinite``, steps skipped since the last call add ``train/nonfinite_skips`` (the
        running count) to ``values``.
        """
        self._tracking.log(values, step, log_kwargs or {})

    def end_training(self) -> None:
        """Waits for a pending asynchronous checkpoint and closes the trackers; call at the end of the script."""
        self._checkpointing.wait()
        self._tracking.finish()

    # -- checkpoints (Checkpointing) --------------------------------------------------------
    def save_state(self, output_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> str:
        """Saves models, optimizers, schedulers, scaler, RNG states, dataloader positions and registered objects.

        ``async_save=True`` returns once the state is copied to CPU memory; ``wait_for_checkpoint``
        (also called by the next save or load, ``end_training`` and ``free_memory``) waits for the files.
        """
        return self._checkpointing.save_state(output_dir, **kwargs)

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> str | None:
        """Restores what ``save_state`` wrote (the newest automatic checkpoint when ``input_dir`` is None);
        returns the folder loaded."""
        return self._checkpointing.load_state(input_dir, **kwargs)

    def wait_for_checkpoint(self) -> str | None:
        """Blocks until an asynchronous ``save_state`` is on disk; returns its folder (None if none pending)."""
        return self._checkpointing.wait()

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike[str], **kwargs: Any) -> None:
        """Writes the model's full weights (safetensors, sharded past ``max_shard_size``) for use outside accel."""
        self._checkpointing.save_model(model, save_directory, **kwargs)

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """``torch.save`` on the main process only (once per machine with ``save_on_each_node``).

        ``safe_serialization=True`` writes a safetensors file through accel-checkpoint (which depends on
        safetensors; accel-core does not), with shared tensors written once.
        """
        self._checkpointing.save(obj, f, safe_serialization)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, weights, output_dir)`` runs before ``save_state`` writes the models."""
        return self._checkpointing.register_hook(self._checkpointing.save_hooks, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """``hook(models, input_dir)`` runs before ``load_state`` loads the models."""
        return self._checkpointing.register_hook(self._checkpointing.load_hooks, hook)

    # -- resuming (Resumption) --------------------------------------------------------------
    def resume_if_possible(self) -> str | None:
        """Loads the newest complete automatic checkpoint, if there is one; returns its folder (else None).

        ``resume="auto"`` calls it once everything the checkpoint holds is prepared; call it
        yourself (after your last ``prepare``) to resume without that switch. Collective: every
        process calls it. The trackers continue the checkpoint's run: the local and TensorBoard
        trackers drop what was logged after it (with no checkpoint: everything an earlier attempt
        logged with a step), so each step is logged once.

        Example::

            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            if accelerator.resume_if_possible():
                accelerator.print(f"resumed at step {accelerator.completed_steps}")
        """
        return self._resumption.resume_if_possible()

    def training_progress(self) -> dict[str, Any]:
        """What ``save_state`` stores of the run besides the objects: optimizer steps and the last logged step."""
        return self._resumption.training_progress()

    def restore_training_progress(self, progress: dict[str, Any]) -> None:
        """Called by ``load_state`` with what ``training_progress`` returned when the checkpoint was saved."""
        self._resumption.restore_training_progress(progress)

    # -- evaluation (MetricsGathering) ------------------------------------------------------
    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gathers predictions or labels for a metric, dropping the samples repeated to even out the last batch.

        Tensors are gathered as tensors; lists of Python objects (strings, say) are concatenated
        across processes; dicts and tuples are gathered leaf by leaf. ``use_gather_object=True``
        gathers the whole input as one picklable object per process instead.
        """
        return self._metrics.gather_for_metrics(input_data, use_gather_object)

    def join_uneven_inputs(
        self, joinables: list[Any], even_batches: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Lets processes with fewer batches finish while the others go on (``torch.distributed.algorithms.Join``).

        even_batches: override the prepared dataloaders' setting inside the block (map-style only).
        """
        return self._metrics.join_uneven_inputs(joinables, even_batches)

    # -- profiling ------------------------------------------------------------------------
    def profile(self, profile_handler: ProfileKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Profiles the block with ``torch.profiler`` and yields the profiler.

        profile_handler: the settings; default the ``ProfileKwargs`` given in ``kwargs_handlers``,
            else torch's defaults. With ``output_trace_dir`` set, each process writes
            ``profile_<process index>.json`` there when the block ends, then waits for the others.

        Example::

            with accelerator.profile(ProfileKwargs(activities=["cpu"], output_trace_dir="traces")) as prof:
                train_step()
            accelerator.print(prof.key_averages().table(row_limit=10))
        """
        return profiled(profile_handler or self.handlers.get(ProfileKwargs) or ProfileKwargs(), self)

    # -- models -----------------------------------------------------------------------------
    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's module from inside the strategy's wrapper.

        keep_torch_compile: for a compiled model, return the user's module in a new compiled wrapper
            with the same compile settings (as Accelerate returns; the prepared model is left as it
            is); False returns the plain module.
        """
        module = self.prepared.record_for(model, self.strategy.unwrap_model).module
        if not keep_fp32_wrapper:
            unwrap_forward(module)
        if is_compiled_module(model) and keep_torch_compile:
            # torch.compile's wrapper class, built around the user's module with the same dynamo context.
            module = type(model)(module, model.dynamo_ctx)
        return module

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        """The full state dict of a prepared model (gathered where the strategy shards it, and over the pipeline
        stages: valid on the main process), fp16 cast to fp32."""
        from ..strategies.model_state import prepared_model_state_dict

        if unwrap:
            record = self.prepared.record_for(model, self.strategy.unwrap_model)
            state_dict = prepared_model_state_dict(self.strategy, record)
        else:
            state_dict = model.state_dict()
        return {
            k: v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.float16 else v
            for k, v in state_dict.items()
        }

    def synchronize_rng_states(self, generator: torch.Generator | None = None) -> None:
        """Copies process 0's RNG states (``rng_types``) to every process."""
        synchronize_rng_states([r for r in self.rng_types if r != "generator" or generator is not None], generator)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drops references to everything prepared and empties device caches (between two trainings).

        The strategy is torn down (``Strategy.teardown``: DeepSpeed's engine and its native optimizer state
        released), so the next ``prepare`` starts afresh."""
        self.wait_for_checkpoint()
        self.strategy.teardown()
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
