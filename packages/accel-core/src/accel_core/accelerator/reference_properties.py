"""The Accelerator's reference-API properties: its settings and its parts' state under the reference's names.

``ReferenceProperties`` is a base class of the Accelerator (with ``TrainingStep``, ``ProcessControl`` and
``SetupQueries``). It holds no field of its own: each property reads, and where the reference lets a script set it
writes, one field of the Accelerator or of one of its parts (declared below); nothing here decides anything.
Scripts read these (``accelerator.mixed_precision``, ``accelerator.trackers``, ``accelerator.completed_steps``) and
libraries written for Accelerate read the private lists (``accelerator._models``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..precision.modes import AutocastPrecision

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from ..configuration import DataLoaderConfiguration, ProjectConfiguration
    from ..enums import DistributedType, SchedulerStepping
    from ..optimizer import AcceleratedOptimizer
    from ..parallel.config import ParallelismConfig
    from ..parallel.dims import ParallelDims
    from ..precision.modes import Precision
    from ..scheduler import AcceleratedScheduler
    from ..strategies import PreparedObjects, Strategy
    from .checkpointing import Checkpointing
    from .preparation import Preparation
    from .resumption import Resumption
    from .tracking import Tracking


class ReferenceProperties:
    """Base of the Accelerator: the reference API's properties, each read from the field or part that holds it."""

    strategy: Strategy
    precision: Precision
    prepared: PreparedObjects
    parallel_dims: ParallelDims
    dataloader_config: DataLoaderConfiguration
    project_configuration: ProjectConfiguration
    _preparation: Preparation
    _tracking: Tracking
    _checkpointing: Checkpointing
    _resumption: Resumption

    # -- the prepared objects, under the reference API's names ------------------------------
    @property
    def _models(self) -> list[torch.nn.Module]:
        """The prepared models as the reference lists them (``Strategy.listed_model``: the user's module, not its DDP
        or ``torch.compile`` wrapper; FSDP1's wrapper, the DeepSpeed engine), in a new list each time. The prepared
        objects themselves are in ``prepared.models``."""
        return [self.strategy.listed_model(record) for record in self.prepared.records]

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

    # -- the run's settings -----------------------------------------------------------------
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
    def device_placement(self) -> bool:
        """Whether ``prepare`` moves objects to ``device`` (the default of its ``device_placement``)."""
        return self._preparation.device_placement

    @device_placement.setter
    def device_placement(self, value: bool) -> None:
        self._preparation.device_placement = value

    @property
    def step_scheduler_with_optimizer(self) -> bool:
        """Whether a prepared LR scheduler steps only when the optimizer really steps."""
        return self._preparation.step_scheduler_with_optimizer

    @step_scheduler_with_optimizer.setter
    def step_scheduler_with_optimizer(self, value: bool) -> None:
        self._preparation.step_scheduler_with_optimizer = value

    @property
    def scheduler_stepping(self) -> SchedulerStepping:
        """``per_process`` or ``per_optimizer_step`` (see ``accel_core.scheduler``)."""
        return self._preparation.scheduler_stepping

    @property
    def scheduler_steps_per_optimizer_step(self) -> int:
        """LR scheduler steps per optimizer step: the data-parallel size (1 with ``split_batches``) with
        ``scheduler_stepping="per_process"``, 1 with ``"per_optimizer_step"``."""
        return self._preparation.scheduler_steps_per_optimizer_step

    # -- the layout (ParallelDims) ---------------------------------------------------------
    @property
    def parallelism_config(self) -> ParallelismConfig:
        """The resolved layout: every size set (``dp_replicate_size`` ... ``pp_size``)."""
        return self.parallel_dims.config

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The job's ``DeviceMesh`` (dimensions ``dp_replicate``, ``dp_shard``, and ``cp`` / ``tp`` when used;
        flattened views ``dp``, ``dp_shard_cp``, ``dp_cp``); None for one process without a process group."""
        return self.parallel_dims.mesh

    @property
    def torch_device_mesh(self) -> DeviceMesh | None:
        """The reference API's name for ``device_mesh``."""
        return self.parallel_dims.mesh

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's place in its tensor-parallel group (0 without tensor parallelism)."""
        return self.parallel_dims.local_rank("tp")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index along the mesh's ``cp`` dimension (0 without context parallelism)."""
        return self.parallel_dims.local_rank("cp")

    @property
    def data_parallel_rank(self) -> int:
        """This process's replica index along ``dp_replicate`` (the reference's meaning; 0 when not replicated)."""
        return self.parallel_dims.local_rank("dp_replicate")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index along ``dp_shard`` (0 when parameters are not sharded)."""
        return self.parallel_dims.local_rank("dp_shard")

    @property
    def pipeline_parallel_rank(self) -> int:
        """This process's index along the mesh's ``pp`` dimension (0 without pipeline parallelism); with
        ``pp_stages_per_rank > 1`` it holds stages ``rank, rank + pp_size, ...``."""
        return self.parallel_dims.local_rank("pp")

    # -- tracking (Tracking) ------------------------------------------------------------------
    @property
    def log_with(self) -> list[Any]:
        """The trackers asked for (names or tracker objects); ``init_trackers`` starts them."""
        return self._tracking.log_with

    @log_with.setter
    def log_with(self, value: list[Any]) -> None:
        self._tracking.log_with = value

    @property
    def trackers(self) -> list[Any]:
        """The trackers ``init_trackers`` started (main process; empty elsewhere)."""
        return self._tracking.trackers

    @trackers.setter
    def trackers(self, value: list[Any]) -> None:
        self._tracking.trackers = value

    @property
    def logging_dir(self) -> str | None:
        """``ProjectConfiguration.logging_dir``: where file-writing trackers write."""
        return self._tracking.logging_dir

    # -- checkpoints (Checkpointing) --------------------------------------------------------
    @property
    def project_dir(self) -> str | None:
        """``ProjectConfiguration.project_dir``: the root of automatic checkpoints."""
        return self.project_configuration.project_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatic checkpoint gets (``ProjectConfiguration.iteration``)."""
        return self.project_configuration.iteration

    @property
    def _save_model_state_pre_hook(self) -> OrderedDict[int, Callable[..., None]]:
        return self._checkpointing.save_hooks  # the reference's name

    @property
    def _load_model_state_pre_hook(self) -> OrderedDict[int, Callable[..., None]]:
        return self._checkpointing.load_hooks  # the reference's name

    @property
    def save_state_pre_hooks(self) -> list[Callable[..., None]]:
        """The hooks ``register_save_state_pre_hook`` added and not removed, in registration order."""
        return list(self._checkpointing.save_hooks.values())

    @property
    def load_state_pre_hooks(self) -> list[Callable[..., None]]:
        """The hooks ``register_load_state_pre_hook`` added and not removed, in registration order."""
        return list(self._checkpointing.load_hooks.values())

    # -- resuming (Resumption) --------------------------------------------------------------
    @property
    def resume(self) -> str | None:
        """``"auto"`` when the run resumes from its newest automatic checkpoint (``resume=``), else None."""
        return self._resumption.resume

    @property
    def resumed_from(self) -> str | None:
        """The checkpoint folder this run resumed from (None on a fresh start)."""
        return self._resumption.resumed_from

    @property
    def completed_steps(self) -> int:
        """Optimizer steps taken (several optimizers stepping on one batch count once); restored on resume."""
        return self._resumption.completed_steps
