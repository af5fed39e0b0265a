"""``MegatronStrategy``: Megatron-core tensor parallelism (TP), pipeline parallelism (PP) and data parallelism (DP)
behind the Accelerator's questions.

What it does differently from the base Strategy (see ``accel_core.strategies.base``):
``setup_environment`` (gives a lone ``python train.py`` a group of one, which Megatron's groups
need), ``prepare_objects`` and ``accepts_object`` (its dummy scheduler becomes a torch LR scheduler),
``dataloader_prepared`` (the batch arguments); and the optional interfaces ``BackwardSyncControl``
(``accumulate`` skips the DP all-reduce) and ``ShardedCheckpointing`` (``save_sharded`` / ``load_sharded``, one
file set per TP shard). A whole-engine strategy on the job's mesh: the plugin's ``tp_degree`` is the
mesh's ``tp``, its ``pp_degree`` the mesh's ``pp`` and the rest is ``dp_replicate`` (the same ranks as
Megatron's TP, PP and DP groups, which ``setup`` checks), so dataloaders shard over the mesh's ``dp``
and the processes of one TP or PP group read the same batches. Sharded data parallelism and context
parallelism on the mesh are refused. With ``pp_degree > 1``, ``prepare`` splits the model itself and
Megatron-core's schedules run it (``accel_megatron.pipeline``); with ``num_micro_batches > 1`` alone, Megatron's
no-pipelining schedule runs the whole model, one micro-batch after the other.

The user builds the model from ``megatron.core.tensor_parallel`` layers *after* creating the
Accelerator (the layers read Megatron's groups when they are built)::

    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    config = accelerator.strategy.model_parallel_config()
    model = MyModel(config)                # ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding
    model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), loader)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accel_core.checkpointing import CheckpointIO
from accel_core.configuration import DistributedDataParallelKwargs
from accel_core.enums import DistributedType
from accel_core.parallel.config import (
    ParallelismConfig,
    requested_size,
    resolve_parallelism,
)
from accel_core.strategies import JointResult, PreparedObjects, Strategy, StrategyContext
from accel_core.strategies.ddp import data_parallel_no_sync, unwrap_ddp, wrap_in_ddp
from accel_core.strategies.groups import join_group_of_one

from .plugin import MegatronLMPlugin

if TYPE_CHECKING:
    from accel_core.pipelining import StagedModel
    from accel_core.settings import RunSettings

    from .checkpointing import ShardLayout

logger = logging.getLogger("accel_megatron")


class MegatronStrategy(Strategy):
    """Tensor parallel within groups of ``tp_degree`` processes, data parallel across those groups.

    Chosen by ``Accelerator(megatron_lm_plugin=MegatronLMPlugin(...))``, ``accel launch --use-megatron``
    or ``strategy: megatron`` in the config file (settings then come from ``ACCEL_MEGATRON_*``).
    ``last_grad_norm`` holds the norm measured by the plugin's ``gradient_clipping``, if set.
    """

    name: ClassVar[str] = "megatron"
    # fp16 would need the inf check of the loss scaler agreed over the TP group (Megatron's optimizer
    # does that); torch's GradScaler decides per process, so TP shards could step differently.
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "bf16")
    splits_model_itself: ClassVar[bool] = True  # Megatron's tensor_parallel layers, built by the user

    def __init__(
        self, plugin: MegatronLMPlugin | None = None, ddp_kwargs: DistributedDataParallelKwargs | None = None
    ) -> None:
        super().__init__()
        if plugin is not None and not isinstance(plugin, MegatronLMPlugin):
            raise TypeError(
                f"megatron_lm_plugin must be an accel_megatron.MegatronLMPlugin, got {type(plugin).__name__}: "
                "from accel_megatron import MegatronLMPlugin."
            )
        # Built by a script itself without a plugin: the ACCEL_MEGATRON_* of this process's settled record
        # (MegatronLMPlugin.from_env settles it); the Accelerator's from_plugin hands over its own record's instead.
        self.plugin = plugin if plugin is not None else MegatronLMPlugin.from_env()
        self.ddp_kwargs = ddp_kwargs
        self.last_grad_norm: torch.Tensor | None = None
        self._warned_replicated = False
        self._batch_sizes: list[int] = []  # of the dataloaders prepared so far

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any], settings: RunSettings) -> MegatronStrategy:
        """Core's factory: the user's plugin, or one read from the settled ``ACCEL_MEGATRON_*`` variables."""
        given = plugin if plugin is not None else MegatronLMPlugin.from_env(settings.environ)
        return cls(given, handlers.get(DistributedDataParallelKwargs))

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.MEGATRON_LM

    # -- layout and processes ---------------------------------------------------------------
    def parallelism(self, requested: ParallelismConfig | None, settings: RunSettings) -> tuple[ParallelismConfig, Any]:
        """``tp`` is the plugin's ``tp_degree``, the rest ``dp_replicate``; refuses a ``tp_degree`` that does not
        divide the processes, or a layout Megatron's groups cannot be (on every process, before any communication)."""
        world_size = settings.world_size
        self.plugin.check_world_size(world_size)
        for dim, degree in (("tp", self.plugin.tp_degree), ("pp", self.plugin.pp_degree)):
            size = requested_size(requested, dim, settings.environ)
            if size not in (1, degree):
                raise ValueError(
                    f"{dim}_size={size} contradicts MegatronLMPlugin({dim}_degree={degree}): Megatron's {dim} size is "
                    "the plugin's; set one of them (or the same value in both)."
                )
        base = requested if requested is not None else ParallelismConfig()
        config = resolve_parallelism(
            dataclasses.replace(base, tp_size=self.plugin.tp_degree, pp_size=self.plugin.pp_degree),
            world_size,
            environ=settings.environ,
        )
        self.check_parallelism(config)
        return config, None

    def check_parallelism(self, config: ParallelismConfig) -> None:
        refused = [f"{dim}_size={config.size(dim)}" for dim in ("dp_shard", "cp") if config.size(dim) > 1]
        if config.size("pp") != self.plugin.pp_degree:
            refused.append(f"pp_size={config.size('pp')}")
        if refused:
            raise ValueError(
                f"The megatron strategy cannot honour {', '.join(refused)}: it runs Megatron's tensor and pipeline "
                "parallelism (tp_degree, pp_degree) with replicated data parallelism. Use FSDP2 (fsdp_plugin) with "
                "ParallelismConfig for sharded data parallelism or context parallelism."
            )

    def setup_environment(self, settings: RunSettings, **kwargs: Any) -> None:
        """With one process, joins a group of one (in memory) for Megatron's groups."""
        join_group_of_one(settings.world_size, **kwargs)

    def setup(self, context: StrategyContext) -> None:
        """Builds Megatron's TP / DP groups and seeds its RNG streams (collective)."""
        super().setup(context)
        # Checked before any communication, so every process raises.
        if context.plan.mixed_precision == "bf16" and self.state.device.type != "cuda":
            raise ValueError(
                "mixed_precision='bf16' with the megatron strategy needs GPUs: Megatron's tensor-parallel layers "
                "re-enter autocast in their backward only on CUDA (torch.amp.custom_bwd(device_type='cuda')), so on "
                f"{self.state.device.type} their bf16 gradients meet fp32 weights. Use mixed_precision='no' here, or "
                "build the model in bf16: accelerator.strategy.model_parallel_config(params_dtype=torch.bfloat16)."
            )
        if self.plugin.sequence_parallelism and self.state.device.type != "cuda":
            raise ValueError(
                "MegatronLMPlugin(sequence_parallelism=True) needs GPUs: Megatron-core's sequence-parallel layers "
                "gather into a buffer it allocates on CUDA (megatron.core.utils.GlobalMemoryBuffer). Set "
                f"sequence_parallelism=False on {self.state.device.type} runs."
            )
        from . import groups

        groups.import_megatron()  # first, so its warnings about Transformer-Engine are filtered
        from . import rng

        groups.initialize(self.plugin, self.state.num_processes)
        rng.seed_streams(self.plugin.seed, self.state.device.type)
        groups.check_same_ranks(context.dims)

    def model_parallel_config(self, **overrides: Any) -> Any:
        """A ``megatron.core.ModelParallelConfig`` for this run's layers: the TP size, sequence parallelism,
        and CPU initialization on CPU runs (Megatron's other path allocates on the GPU). ``overrides`` win."""
        from megatron.core.model_parallel_config import ModelParallelConfig

        settings: dict[str, Any] = {
            "tensor_model_parallel_size": self.plugin.tp_degree,
            "pipeline_model_parallel_size": self.plugin.pp_degree,
            "sequence_parallel": self.plugin.sequence_parallelism,
            "use_cpu_initialization": self.state.device.type == "cpu",
        }
        if self.plugin.pp_degree > 1:
            settings["pipeline_dtype"] = self._activation_dtype()
        settings.update(overrides)
        return ModelParallelConfig(**settings)

    # -- models -----------------------------------------------------------------------------
    def prepare_model(self, model: nn.Module, device_placement: bool) -> nn.Module:
        """Places the model and wraps it in torch DDP over Megatron's DP group (when there are DP replicas). With
        ``pp_degree > 1``: keeps this rank's chunk(s) and returns a ``MegatronPipelinedModel`` instead (its
        gradients are averaged over the DP group after each schedule run, at accumulation boundaries); with
        ``num_micro_batches > 1`` and no pipeline stages, the same around the whole model (Megatron's
        no-pipelining schedule).

        Why torch's DDP and not ``megatron.core.distributed.DistributedDataParallel``: Megatron's
        allocates its contiguous gradient buffers with ``torch.cuda.current_device()`` and syncs on
        CUDA streams (megatron-core 0.16-0.19), so it cannot run on a CPU / gloo job; torch DDP over
        the same DP group averages the same gradients and runs everywhere.
        """
        from .weights import is_tp_sharded

        if self.plugin.pp_degree > 1 or self.plugin.num_micro_batches > 1:
            return self._prepare_pipeline(model, device_placement)
        model = super().prepare_model(model, device_placement)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if (
            self.plugin.tp_degree > 1
            and trainable
            and not any(is_tp_sharded(p) for p in trainable)
            and not self._warned_replicated
        ):
            self._warned_replicated = True
            logger.warning(
                "accel-megatron: %s has no tensor-parallel layer, so every TP rank holds and computes all of it. Build "
                "it from megatron.core.tensor_parallel layers (ColumnParallelLinear, RowParallelLinear, "
                "VocabParallelEmbedding) after creating the Accelerator.",
                type(model).__name__,
            )
        if isinstance(model, DistributedDataParallel) or not trainable or self.context.dims.dp.size == 1:
            return model
        from .groups import data_parallel_group

        return wrap_in_ddp(model, self.ddp_kwargs, self.state.device, data_parallel_group())

    def _prepare_pipeline(self, model: nn.Module, device_placement: bool) -> nn.Module:
        from .pipeline import MegatronPipelinedModel, schedule_config, split_for_megatron

        # Without pipeline stages (micro-batches only) the whole model is the one chunk: Megatron's no-pipelining
        # schedule runs it, one forward and backward per micro-batch.
        whole = self.plugin.pp_degree == 1
        chunks = [
            super(MegatronStrategy, self).prepare_model(chunk, device_placement)
            for chunk in ([model] if whole else split_for_megatron(model, self.plugin.pp_degree, self.plugin.vp_degree))
        ]
        first = next((p for chunk in chunks for p in chunk.parameters()), None)
        config = schedule_config(
            self.plugin.tp_degree,
            self.plugin.pp_degree,
            self.plugin.vp_degree,
            self._activation_dtype(None if first is None else first.dtype),
            self.plugin.sequence_parallelism,
        )
        return MegatronPipelinedModel(
            chunks, config, self.plugin.num_micro_batches, self.state.device, self._finish_pipeline_gradients
        )

    def _activation_dtype(self, parameter_dtype: torch.dtype | None = None) -> torch.dtype:
        """The dtype of the activations sent between pipeline stages: bf16 under bf16 autocast, else the weights'."""
        if self.context.plan.mixed_precision == "bf16":
            return torch.bfloat16
        return parameter_dtype if parameter_dtype is not None else torch.float32

    def _finish_pipeline_gradients(self, params: list[nn.Parameter]) -> None:
        """After a schedule run: at accumulation boundaries, the DP average (no DDP wrapper under the schedule) and
        Megatron's gradient finishing."""
        if not self.context.sync_gradients:
            return
        if self.context.dims.dp.size > 1:
            from . import grads
            from .groups import data_parallel_group

            grads.average_over(params, data_parallel_group())
        self._finish_gradients(params)

    def _finish_gradients(self, params: list[nn.Parameter]) -> None:
        """Megatron's gradient finishing at a synced step: sequence-parallel sums over TP, the plugin's clipping."""
        from . import grads

        if self.plugin.sequence_parallelism:
            grads.allreduce_sequence_parallel_grads(params)
        if self.plugin.gradient_clipping is not None:
            self.last_grad_norm = grads.clip_grad_norm_(params, self.plugin.gradient_clipping)

    # -- preparation: the batch arguments, Megatron's own scheduler type ------------------------
    def dataloader_prepared(self, dataloader: Any) -> None:
        """Sets the plugin's ``micro_batch_size``, ``data_parallel_size`` and ``global_batch_size`` as Accelerate
        does: the smallest batch size of the dataloaders prepared (the largest with ``is_train_batch_min=False``)."""
        batch_size = getattr(dataloader, "batch_size", None)  # None for a loader made from a batch sampler
        if not isinstance(batch_size, int):
            return
        self._batch_sizes.append(batch_size)
        micro = min(self._batch_sizes) if self.plugin.is_train_batch_min else max(self._batch_sizes)
        self.plugin.set_training_args(micro, self.plugin.check_world_size(self.state.num_processes))

    def accepts_object(self, obj: Any) -> bool:
        """``prepare`` takes a ``MegatronLMDummyScheduler``."""
        from .scheduler import MegatronLMDummyScheduler

        return isinstance(obj, MegatronLMDummyScheduler)

    def prepare_objects(self, objects: list[Any], prepare_separately: Callable[[list[Any]], list[Any]]) -> JointResult:
        """Each object on its own, as by default, once a ``MegatronLMDummyScheduler`` has become Megatron's schedule
        as a torch LR scheduler (which is then prepared like the user's own)."""
        from .scheduler import build_scheduler

        converted = [
            build_scheduler(obj, self.plugin.lr_decay_style, float(self.plugin.min_lr))
            if self.accepts_object(obj)
            else obj
            for obj in objects
        ]
        return JointResult(prepare_separately(converted))

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return unwrap_ddp(model)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Skips the DP all-reduce inside the block (accumulation micro-steps)."""
        return data_parallel_no_sync(model)

    # -- the training step ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``; at accumulation boundaries, then Megatron's gradient finishing: sequence-parallel
        gradients summed over the TP group, and the plugin's ``gradient_clipping``."""
        loss.backward(**kwargs)
        if not self.context.sync_gradients:
            return
        if not (self.plugin.sequence_parallelism or self.plugin.gradient_clipping is not None):
            return
        params = [p for model in self.context.prepared.models for p in model.parameters() if p.requires_grad]
        self._finish_gradients(params)

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clips to ``max_norm`` and returns the norm of the whole (unsplit) model's gradients. Collective."""
        from . import grads

        return grads.clip_grad_norm_(list(parameters), max_norm, norm_type)

    # -- state ------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The full weights, TP shards gathered along their ``partition_dim``, on every process (with pipeline stages:
        gathered over them too, on the first pipeline rank only). Collective."""
        from .weights import full_state_dict

        pipeline = self._pipeline_of(model)
        if pipeline is not None:  # gathered over the stages too, onto the main process
            return pipeline.full_state_dict()
        return full_state_dict(self.unwrap_model(model))

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> Any:
        """Loads full weights (as ``model_state_dict`` returns them); each TP rank keeps its own block."""
        from .weights import load_full_state_dict

        pipeline = self._pipeline_of(model)
        if pipeline is not None:
            return pipeline.load_full_state_dict(state_dict, strict=strict)
        return load_full_state_dict(self.unwrap_model(model), state_dict)

    def _pipeline_of(self, model: nn.Module) -> StagedModel | None:
        """The pipeline of prepared ``model``, as its record says (None: not split, or never prepared)."""
        record = self.context.prepared.record_of(model)
        return record.pipeline if record is not None else None

    def save_sharded(
        self, prepared: PreparedObjects, folder: str, *, io: CheckpointIO, **kwargs: Any
    ) -> tuple[str, ...]:
        """``ShardedCheckpointing``: each TP shard written once (by DP rank 0). Collective."""
        from .checkpointing import save_sharded

        return save_sharded(self._shard_layout(), self.context.state.process_index == 0, prepared, folder, io)

    def load_sharded(
        self,
        prepared: PreparedObjects,
        folder: str,
        *,
        io: CheckpointIO,
        allow_unsafe_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Restores what ``save_sharded`` wrote; another ``tp_degree`` is a ``CheckpointMismatchError``. Collective."""
        from .checkpointing import load_sharded

        load_sharded(self._shard_layout(), prepared, folder, io)

    def _shard_layout(self) -> ShardLayout:
        from .checkpointing import ShardLayout

        plugin = self.plugin
        return ShardLayout(plugin.tp_degree, plugin.pp_degree, plugin.vp_degree, self.context.dims.dp.size)

    # -- the end of a run ---------------------------------------------------------------------
    def teardown(self) -> None:
        """Forgets this run's state: the batch sizes of the dataloaders prepared (and the plugin's batch arguments
        computed from them), the last clipping norm, the once-per-run warning about a model without TP layers.

        What Megatron holds for a run lives elsewhere and stays: the models' DDP wrappers (and their
        gradient hooks) are prepared objects, the Accelerator's, freed with them; Megatron's parallel groups
        and RNG streams are built by ``setup`` (once per Accelerator, or adopted from the user or another
        Accelerator) and used by the tensor-parallel layers the user built, and by a later ``prepare``:
        they belong to the job like the mesh's groups and end with the default group at exit (or with
        ``megatron.core.parallel_state.destroy_model_parallel()``, the script's call). So nothing native
        to release and no communication: idempotent, and safe on one process alone.
        """
        self._batch_sizes = []
        self.last_grad_norm = None
        self._warned_replicated = False
        self.plugin.clear_training_args()

    def __repr__(self) -> str:
        plugin = self.plugin
        return (
            f"MegatronStrategy(tp_degree={plugin.tp_degree}, pp_degree={plugin.pp_degree}, "
            f"sequence_parallelism={plugin.sequence_parallelism})"
        )
