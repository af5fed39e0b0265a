"""The Strategy contract: everything the Accelerator (or another package) asks of a backend, declared here.

The contract is one-way. The Accelerator settles the run's settings once (``accel_core.settings.RunSettings``),
builds a strategy (``from_plugin``), asks it which layout it runs (``parallelism``), lets it set up the processes
(``setup_environment``), asks it for its Precision (``make_precision``), then hands it a narrow ``StrategyContext``
(device, mesh, precision, plan, settings, prepared objects) in ``setup``. Each step gets the settled record: a
strategy reads its settings there, never in ``os.environ``. The strategy answers questions and returns what it
prepared; it never writes the Accelerator's fields.

The base class's methods carry the general case (torchrun's process group, each object prepared on
its own, torch's optimizer step), so a backend overrides only what it does differently; plain facts
are class flags (``owns_optimizer_step``, ``replaces_parameters``, ``splits_model_itself``). Only
what is truly optional, and would cost something if every strategy had it, stays a small protocol
checked with ``isinstance`` (never a backend's name):

- ``BackwardSyncControl``: skip gradient synchronisation while accumulating (DDP, FSDP, Megatron).
- ``ReducesGradients``: the gradients are reduced across processes right before the optimizer
  steps (XLA, which has no DDP hooks); clipping reduces first.
- ``BatchTransfer``: a device loader / step marker for batches (XLA).
- ``ShardedCheckpointing``: the backend saves and loads its (sharded) models and optimizers itself
  (accel-checkpoint writes everything else around them, and hands it a ``CheckpointIO``); declared with the
  rest of the checkpoint contract in ``accel_core.checkpointing`` and re-exported here.

The lifecycle ends with ``teardown`` (release engines, native state and hooks; idempotent), which the
Accelerator calls from ``free_memory`` and once at exit for a strategy still alive then
(``accel_core.accelerator.teardown``): no backend registers exit hooks of its own.

A model is prepared by the strategy's one straight chain, ``parallelize`` (precision conversion, tensor
parallelism, activation checkpointing, compile, the data-parallel wrapper, in that order, each a technique function
of ``accel_core.transforms``): the default below, whose data-parallel step is ``prepare_model``; FSDP has its own.
A model prepared with ``evaluation_mode=True`` takes ``prepare_for_evaluation``: ``prepare_eval_model`` (placed, not
wrapped) in place of the data-parallel step, then the whole model compiled.
What the chain returns (``ModelParts``) becomes the model's one record (``accel_core.prepared_model``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from ..checkpointing.contract import ShardedCheckpointing as ShardedCheckpointing  # re-exported: declared there
from ..enums import DistributedType
from ..install_hints import accel_extra
from ..parallel.config import ParallelismConfig, resolve_parallelism
from ..precision.choice import default_precision
from ..precision.modes import Precision, PrecisionContext
from .context import JointResult, StrategyContext

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..optimizer_rebuild import ParameterNames
    from ..placement import ProcessPlacement
    from ..prepared_model import ModelParts, PreparedModel
    from ..settings import RunSettings
    from ..state import AcceleratorState


def on_device(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether every parameter and buffer of ``model`` is on ``device`` already (then ``to`` has nothing to do, and
    is not called: it would swap tensor-subclass parameters, such as fp8 weights, for copies)."""
    tensors = [*model.parameters(), *model.buffers()]
    return all(t.device == device for t in tensors)


class Strategy:
    """Base class with the single-process answers; subclasses override what differs.

    Class attributes:
        name: the ``accel.strategies`` entry-point name.
        supported_precisions: the ``mixed_precision`` values the strategy accepts.
        data_parallel_dim: the mesh dimension that takes the processes no size claims.
        splits_model_itself: the backend's own layers split the model over ``tp`` (Megatron), and its
            ``prepare_model`` splits it over ``pp``, so the transform chain's tensor-parallel step and
            pipeline split are skipped.
        owns_optimizer_step: the backend steps the optimizer and zeroes gradients at accumulation
            boundaries itself, and scales the loss for accumulation (DeepSpeed's engine): the
            Accelerator neither divides the loss nor guards the step.
        replaces_parameters: ``prepare_model`` always puts new parameter objects in the model
            (sharding), so an optimizer built before ``prepare`` is rebuilt on them
            (``rebuild_optimizer``) even where the parameter ids alone would not tell.

    Attributes:
        plugin: the user's plugin object (``fsdp_plugin=...``) or None; scripts written for the
            reference read it as ``AcceleratorState().fsdp_plugin`` and kin.
    """

    name: ClassVar[str] = "base"
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "fp16", "bf16", "fp8")
    data_parallel_dim: ClassVar[str] = "dp_replicate"
    splits_model_itself: ClassVar[bool] = False
    owns_optimizer_step: ClassVar[bool] = False
    replaces_parameters: ClassVar[bool] = False

    def __init__(self) -> None:
        self.plugin: Any = None
        self._context: StrategyContext | None = None

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any], settings: RunSettings) -> Strategy:
        """Builds the strategy from the user's plugin (None: defaults / the settled ``ACCEL_<NAME>_*`` variables of
        ``settings``) and kwargs handlers."""
        if plugin is not None:
            raise TypeError(f"The {cls.name} strategy takes no plugin, got {type(plugin).__name__}.")
        return cls()

    # -- layout -----------------------------------------------------------------------------
    def parallelism(
        self, requested: ParallelismConfig | None, settings: RunSettings
    ) -> tuple[ParallelismConfig, DeviceMesh | None]:
        """The complete layout this strategy runs, and a mesh its plugin already holds (None: build one).

        ``settings``: the run's settled record (world and local world size, the ``ACCEL_<DIM>_SIZE`` variables).
        Pure (no communication), so a layout the strategy refuses fails on every process alike.
        """
        config = resolve_parallelism(
            requested, settings.world_size, data_parallel_dim=self.data_parallel_dim, environ=settings.environ
        )
        self.check_parallelism(config)
        return config, None

    def check_parallelism(self, config: ParallelismConfig) -> None:
        """Raises ValueError naming the fix when ``config`` needs an axis the strategy cannot honour.

        Core's strategies replicate over data parallelism and run tensor parallelism; sharding
        parameters (``dp_shard``) and context parallelism need FSDP2.
        """
        needs_fsdp = [f"{dim}_size={config.size(dim)}" for dim in ("dp_shard", "cp") if config.size(dim) > 1]
        if needs_fsdp:
            raise ValueError(
                f"{', '.join(needs_fsdp)} needs FSDP2 (parameters sharded over dp_shard x cp), which the {self.name} "
                f"strategy does not do: pass fsdp_plugin=FullyShardedDataParallelPlugin() ({accel_extra('fsdp')}) "
                "or accel launch --use-fsdp."
            )

    # -- processes --------------------------------------------------------------------------
    def setup_environment(self, settings: RunSettings, **init_kwargs: Any) -> ProcessPlacement | None:
        """Sets the processes up; called once, after ``parallelism`` and before the process state exists.

        ``settings`` is the run's settled record (rank, world, where rank 0 listens); ``init_kwargs`` are the user's
        ``InitProcessGroupKwargs`` (with ``--collective-timeout`` applied). The default does nothing: the process
        state then joins the job's group with them, and reads rank, world and device from the record. A backend that
        joins the group its own way does it here (deepspeed.comm; a group of one for FSDP and Megatron; torch-xla's
        backend). One whose runtime, not the launcher, says which process this is returns that ``ProcessPlacement``
        (XLA's PJRT; ``accel_core.placement``), which the state takes instead.
        """
        return None

    # -- precision --------------------------------------------------------------------------
    def make_precision(self, name: str, context: PrecisionContext) -> Precision:
        """The Precision this strategy trains with for ``mixed_precision=name`` (one of ``supported_precisions``).

        Called once, before ``setup``; its ``name`` becomes ``accelerator.mixed_precision``. The default
        is core's (``accel_core.precision.choice.default_precision``): fp8 from accel-fp8, autocast
        for bf16 / fp16 with torch's GradScaler. A strategy that needs another GradScaler passes it
        there; one that applies precision itself returns its own Precision subclass, named after
        what it computes in (DeepSpeed settles that from its config).
        """
        return default_precision(name, context)

    # -- lifecycle --------------------------------------------------------------------------
    def setup(self, context: StrategyContext) -> None:
        """Called once, after the process group, the mesh and the precision exist. May communicate."""
        self._context = context

    def teardown(self) -> None:
        """Releases what the strategy built for the objects it prepared; the strategy may prepare anew afterwards.

        What to release: engines and the native state they hold (DeepSpeed's engine and its CPU Adam),
        hooks the strategy put on models or parameters, process groups the strategy made for itself
        alone. Not the default process group nor the mesh's groups (the process state owns them and
        destroys them at exit), nor the prepared objects' lists (the Accelerator's). After it the
        strategy holds none of the prepared objects, as after ``setup``: a later ``prepare`` starts
        afresh (a second engine, not an error about the first).

        Idempotent: a second call, or a call with nothing prepared, does nothing. Local: no
        collective (one process may reach it before the others, or alone at exit).

        Called by the Accelerator only: from ``free_memory()`` / ``clear()`` (where the reference drops its
        DeepSpeed engine), and once more, for an Accelerator that is garbage-collected or still alive at
        interpreter exit, from the one exit hook of ``accel_core.accelerator.teardown`` (run before the process
        groups are destroyed and before Python finalizes modules, whose order would free native state too
        late). Not from ``end_training()``: as in the reference, scripts go on using the prepared model after
        it (saving its weights, ``get_state_dict``, ``wait_for_everyone``). No backend registers its own
        ``atexit`` hook, finalizer or ``__del__`` for this (tests/packaging/test_no_exit_hooks.py checks).

        The default releases nothing: core's strategies hold nothing but the context.
        """

    @property
    def context(self) -> StrategyContext:
        if self._context is None:
            raise RuntimeError(f"The {self.name} strategy was used before the Accelerator set it up.")
        return self._context

    @property
    def state(self) -> AcceleratorState:
        return self.context.state

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.NO

    # -- models ---------------------------------------------------------------------------
    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The model's repeated blocks, where activation checkpointing and per-block compile apply.

        Default: modules whose class is named in the model's ``_no_split_modules`` (the Hugging
        Face convention), children before parents; empty when it names none.
        """
        names = set(getattr(model, "_no_split_modules", None) or ())
        return [m for m in model.modules() if m is not model and type(m).__name__ in names]

    @property
    def activation_checkpointing(self) -> bool:
        """Whether the strategy's own settings ask for activation checkpointing of each block."""
        return False

    def parallelize(self, model: torch.nn.Module, device_placement: bool) -> ModelParts:
        """Turns ``model`` (or one pipeline stage of it) into what this strategy trains, with one straight chain of
        the technique functions of ``accel_core.transforms``; returns its parts (what runs forward, the wrapper, the
        user's module inside), from which ``prepare`` makes the model's record.

        The default chain, steps 1-6 of ``accel_core.transforms``' docstring top to bottom: precision conversion,
        tensor parallelism (unless ``splits_model_itself``) and the context-parallel check, activation checkpointing
        of ``blocks``, per-block compile, ``prepare_model``, whole-model compile. A backend whose wrapping changes what
        comes before it (FSDP2 shards the blocks) writes its own chain.
        """
        from ..transforms import checkpoint_blocks, compile_blocks, compile_settings, compile_whole

        context = self.context
        config = context.dims.config
        model = context.precision.convert_module(model)
        if config.tp_enabled and not self.splits_model_itself:
            from ..transforms.tensor_parallel import apply_tensor_parallel

            model = apply_tensor_parallel(model, context.dims.submesh("tp"), config, context.precision)
        if config.cp_enabled:
            from ..transforms.context_parallel import check_model

            check_model(model, config.size("cp"))
        blocks = self.blocks(model)
        if config.activation_checkpointing or self.activation_checkpointing:
            checkpoint_blocks(blocks, model)
        dynamo = compile_settings(context)
        if dynamo is not None and blocks:
            compile_blocks(blocks, **dynamo.to_kwargs())
        wrapped = self.prepare_model(model, device_placement=device_placement)
        return compile_whole(wrapped, self.unwrap_model(wrapped), None if blocks else dynamo, unwrap=self.unwrap_model)

    def prepare_for_evaluation(self, model: torch.nn.Module, device_placement: bool) -> ModelParts:
        """The chain of a model only run forward (``evaluation_mode=True``): precision conversion,
        ``prepare_eval_model`` (placed, not wrapped), then, as in the reference, ``torch.compile`` of the whole model
        (region by region with ``use_regional_compilation=True``). Neither split, checkpointed nor compiled block by
        block: what runs is ``torch.compile``'s module around the user's, as for a model without blocks in training.
        """
        from ..transforms import compile_settings, compile_whole

        model = self.context.precision.convert_module(model)
        placed = self.prepare_eval_model(model, device_placement=device_placement)
        return compile_whole(
            placed, self.unwrap_model(placed), compile_settings(self.context), unwrap=self.unwrap_model
        )

    def prepare_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        """The data-parallel step of the default chain (``parallelize``): place the model (and wrap it, in
        data-parallel strategies)."""
        return self.place_model(model, device_placement)

    def prepare_eval_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        """The data-parallel step of ``prepare_model(model, evaluation_mode=True)``, instead of ``prepare_model``
        (``prepare_for_evaluation``; ``torch.compile`` of the whole model follows).

        Such a model is only run forward (a frozen reference model, an evaluator), so, as in the reference, it
        is placed but not wrapped for training: no DDP, no FSDP sharding, no engine. Every process holds all of
        it and runs it on its own, so a forward on one process alone needs no other (DDP would broadcast
        buffers), and the model's own methods (``generate``) stay reachable. The default is ``place_model``;
        a backend that must still do something to a model it does not train overrides this.
        """
        return self.place_model(model, device_placement)

    def place_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        """Puts ``model`` on this process's device (with ``device_placement``); a model built on the meta device is
        given memory and values there. The whole of the base ``prepare_model``."""
        from ..transforms.meta_init import has_meta_tensors, materialize

        if has_meta_tensors(model):
            materialize(model, self.context.device)
        elif device_placement and not on_device(model, self.context.device):
            model = model.to(self.context.device)
        return model

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Returns the user's module from inside whatever ``prepare_model`` wrapped it in."""
        return model

    def listed_model(self, prepared: PreparedModel) -> torch.nn.Module:
        """What the reference API lists for a prepared model (its record): in ``accelerator._models``, and among the
        models given to the save- and load-state pre-hooks (``register_save_state_pre_hook``).

        The reference keeps the user's module there, not its DDP wrapper nor its ``torch.compile`` wrapper, so a
        hook can call the model's own methods (``save_pretrained``) and reads plain state-dict keys. The
        default is that module (``prepared.module``); a backend whose wrapper the reference lists instead
        overrides this (FSDP1's wrapper, the DeepSpeed engine: ``prepared.wrapped``).
        """
        return prepared.module

    # -- preparation of one prepare() call ----------------------------------------------------
    def accepts_object(self, obj: Any) -> bool:
        """Whether ``prepare`` takes ``obj``, an object of the backend's own types (not a torch one): DeepSpeed's LR
        schedules, Megatron's dummy scheduler. Such objects reach ``prepare_objects`` like the others."""
        return False

    def prepare_objects(self, objects: list[Any], prepare_separately: Callable[[list[Any]], list[Any]]) -> JointResult:
        """Prepares the objects of one ``prepare`` call, in the order given (dataloaders already prepared).

        The default prepares each on its own: ``prepare_separately`` is the Accelerator's path (models
        through the transform chain and ``prepare_model``, optimizers rebuilt where parameters were
        replaced and wrapped, schedulers wrapped), and registers what it prepared. A backend that
        prepares model, optimizer and scheduler in one call (DeepSpeed's ``initialize``) returns its
        own replacements, plus optimizers it created, and the Accelerator registers them; one whose own
        types stand for torch objects (Megatron's dummy scheduler) converts them, then calls
        ``prepare_separately``.
        """
        return JointResult(prepare_separately(objects))

    def rebuild_optimizer(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, names: ParameterNames
    ) -> torch.optim.Optimizer:
        """The same optimizer on the new parameters of prepared ``model`` (built before ``prepare`` replaced them).

        ``names`` knows each original parameter's name (recorded before any transform), to match the
        new ones. The default rebuilds it by name, and says so on the main process unless the
        parameters were only moved to another device (the usual flow on XLA, as in the reference).
        """
        from ..optimizer_rebuild import only_moved, rebuild

        model = self.unwrap_model(model)  # names were recorded before wrapping (no DDP "module." prefix)
        announce = self.state.is_main_process and not only_moved(optimizer, model)
        return rebuild(optimizer, model, names, announce=announce)

    def dataloader_prepared(self, dataloader: Any) -> None:
        """Hears of each dataloader ``prepare`` is given (the user's, before preparing); the default ignores it.

        Megatron sets its batch arguments (``micro_batch_size``, ``global_batch_size``) from the batch size.
        """

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """Clips to ``max_norm`` and returns the total norm of all gradients (global over the whole mesh)."""
        from ..grads import clip_grad_norm_

        dims = self.context.dims
        pipeline = dims.group("pp") if dims.config.pp_enabled else None
        return clip_grad_norm_(list(parameters), max_norm, norm_type, pipeline)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The full (unsharded) state dict of a prepared model, valid at least on the main process. Collective
        when the model holds DTensors (gathered onto process 0's CPU; ``{}`` on the others)."""
        from ..transforms.state_dict import full_state_dict

        return full_state_dict(self.unwrap_model(model))

    def load_model_state_dict(self, model: torch.nn.Module, state_dict: dict[str, Any], strict: bool = True) -> Any:
        """Loads a full state dict (the same on every process) into a prepared model; shards keep their part."""
        from ..transforms.state_dict import load_full_state_dict

        return load_full_state_dict(self.unwrap_model(model), state_dict, strict=strict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@runtime_checkable
class BackwardSyncControl(Protocol):
    """Gradient synchronisation can be skipped on accumulation micro-steps."""

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]: ...


@runtime_checkable
class ReducesGradients(Protocol):
    """The backend reduces gradients across processes itself, right before each real optimizer step.

    ``reduce_gradients`` is called by the prepared optimizer at accumulation boundaries, before it
    steps (only the gradients not reduced yet since the last step, e.g. by clipping).
    """

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None: ...


@runtime_checkable
class BatchTransfer(Protocol):
    """The backend moves batches to its device itself and marks step boundaries (XLA).

    ``wrap_dataloader`` gets a prepared loader that leaves batches on the CPU and returns the loader
    the user iterates; ``mark_step`` runs what the backend has recorded so far (called before a
    checkpoint is written).
    """

    def wrap_dataloader(self, dataloader: Any) -> Any: ...

    def mark_step(self) -> None: ...
