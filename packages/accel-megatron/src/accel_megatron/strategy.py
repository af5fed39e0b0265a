"""``MegatronStrategy``: Megatron-core tensor parallelism (TP) + data parallelism (DP) behind the Accelerator's questions.

Capabilities it implements (see ``accel_core.strategies.base``): ``ProcessGroupSetup`` (checks the
plugin against the number of processes before any communication, and gives a lone ``python
train.py`` a group of one, which Megatron's groups need), ``BackwardSyncControl`` (``accumulate``
skips the DP all-reduce), and accel-checkpoint's ``ShardedCheckpointing`` (``save_sharded`` /
``load_sharded``, one file set per TP shard). Dataloaders shard over Megatron's DP group, so the
processes of one TP group read the same batches.

The user builds the model from ``megatron.core.tensor_parallel`` layers *after* creating the
Accelerator (the layers read Megatron's groups when they are built)::

    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    config = accelerator.strategy.model_parallel_config()
    model = MyModel(config)                # ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding
    model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), loader)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from accel_core import environment as env
from accel_core.configuration import DistributedDataParallelKwargs
from accel_core.enums import DistributedType
from accel_core.strategies.base import Strategy
from accel_core.strategies.ddp import wrap_in_ddp
from accel_core.strategies.groups import join_group_of_one
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .plugin import MegatronLMPlugin

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
    owns_precision: ClassVar[bool] = False
    launcher: ClassVar[str] = "torchrun"

    def __init__(self, plugin: MegatronLMPlugin | None = None, ddp_kwargs: DistributedDataParallelKwargs | None = None) -> None:
        super().__init__()
        if plugin is not None and not isinstance(plugin, MegatronLMPlugin):
            raise TypeError(
                f"megatron_lm_plugin must be an accel_megatron.MegatronLMPlugin, got {type(plugin).__name__}: "
                "from accel_megatron import MegatronLMPlugin."
            )
        self.plugin = plugin if plugin is not None else MegatronLMPlugin.from_env()
        self.ddp_kwargs = ddp_kwargs
        self.last_grad_norm: torch.Tensor | None = None
        self._warned_replicated = False

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any] | None = None) -> MegatronStrategy:
        """Core's factory: the user's plugin, or one read from ``ACCEL_MEGATRON_*``."""
        return cls(plugin, (handlers or {}).get(DistributedDataParallelKwargs))

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.MEGATRON_LM

    # -- processes --------------------------------------------------------------------------
    def init_process_group(self, **kwargs: Any) -> None:
        """Refuses a ``tp_degree`` that does not divide the processes (on every process, before any
        communication); with one process, joins a group of one (in memory) for Megatron's groups."""
        self.plugin.check_world_size(env.get_int(env.WORLD_SIZE, 1) or 1)
        join_group_of_one(**kwargs)

    def setup(self, accelerator: Any) -> None:
        """Builds Megatron's TP / DP groups and seeds its RNG streams (collective)."""
        super().setup(accelerator)
        # Checked before any communication, so every process raises.
        if accelerator.plan.mixed_precision == "bf16" and self.state.device.type != "cuda":
            raise ValueError(
                "mixed_precision='bf16' with the megatron strategy needs GPUs: Megatron's tensor-parallel layers re-enter "
                "autocast in their backward only on CUDA (torch.amp.custom_bwd(device_type='cuda')), so on "
                f"{self.state.device.type} their bf16 gradients meet fp32 weights. Use mixed_precision='no' here, or build "
                "the model in bf16: accelerator.strategy.model_parallel_config(params_dtype=torch.bfloat16)."
            )
        if self.plugin.sequence_parallelism and self.state.device.type != "cuda":
            raise ValueError(
                "MegatronLMPlugin(sequence_parallelism=True) needs GPUs: Megatron-core's sequence-parallel layers gather "
                "into a buffer it allocates on CUDA (megatron.core.utils.GlobalMemoryBuffer). Set sequence_parallelism=False "
                f"on {self.state.device.type} runs."
            )
        from . import groups

        groups.import_megatron()  # first, so its warnings about Transformer-Engine are filtered
        from . import rng

        groups.initialize(self.plugin, self.state.num_processes)
        rng.seed_streams(self.plugin.seed, self.state.device.type)

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
        settings.update(overrides)
        return ModelParallelConfig(**settings)

    # -- data parallelism -------------------------------------------------------------------
    @property
    def data_parallel_size(self) -> int:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_world_size()

    @property
    def data_parallel_rank(self) -> int:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_rank()

    @property
    def data_parallel_group(self) -> dist.ProcessGroup | None:
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_group()

    # -- models -----------------------------------------------------------------------------
    def prepare_model(self, model: nn.Module, device_placement: bool) -> nn.Module:
        """Places the model and wraps it in torch DDP over Megatron's DP group (when there are DP replicas).

        Why torch's DDP and not ``megatron.core.distributed.DistributedDataParallel``: Megatron's
        allocates its contiguous gradient buffers with ``torch.cuda.current_device()`` and syncs on
        CUDA streams (megatron-core 0.16-0.19), so it cannot run on a CPU / gloo job; torch DDP over
        the same DP group averages the same gradients and runs everywhere.
        """
        from .weights import is_tp_sharded

        model = super().prepare_model(model, device_placement)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if self.plugin.tp_degree > 1 and trainable and not any(is_tp_sharded(p) for p in trainable) and not self._warned_replicated:
            self._warned_replicated = True
            logger.warning(
                "accel-megatron: %s has no tensor-parallel layer, so every TP rank holds and computes all of it. Build it from "
                "megatron.core.tensor_parallel layers (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding) "
                "after creating the Accelerator.",
                type(model).__name__,
            )
        if isinstance(model, DistributedDataParallel) or not trainable or self.data_parallel_size == 1:
            return model
        return wrap_in_ddp(model, self.ddp_kwargs, self.state.device, self.data_parallel_group)

    # -- Megatron's own types in prepare (PreparesOwnTypes, ConvertsOwnTypes) -----------------
    def accepts_object(self, obj: Any) -> bool:
        """``prepare`` takes a ``MegatronLMDummyScheduler``."""
        from .scheduler import MegatronLMDummyScheduler

        return isinstance(obj, MegatronLMDummyScheduler)

    def convert_object(self, obj: Any) -> Any:
        """A ``MegatronLMDummyScheduler`` becomes Megatron's schedule as a torch LR scheduler."""
        from .scheduler import build_scheduler

        return build_scheduler(obj, self.plugin.lr_decay_style, float(self.plugin.min_lr))

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skips the DP all-reduce inside the block (accumulation micro-steps)."""
        with model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext():
            yield

    # -- the training step ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``; at accumulation boundaries, then Megatron's gradient finishing: sequence-parallel
        gradients summed over the TP group, and the plugin's ``gradient_clipping``."""
        loss.backward(**kwargs)
        if self.accelerator is None or not self.accelerator.sync_gradients:
            return
        if not (self.plugin.sequence_parallelism or self.plugin.gradient_clipping is not None):
            return
        from . import grads

        params = [p for model in self.accelerator._models for p in model.parameters() if p.requires_grad]
        if self.plugin.sequence_parallelism:
            grads.allreduce_sequence_parallel_grads(params)
        if self.plugin.gradient_clipping is not None:
            self.last_grad_norm = grads.clip_grad_norm_(params, self.plugin.gradient_clipping)

    def clip_grad_norm_(self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips to ``max_norm`` and returns the norm of the whole (unsplit) model's gradients. Collective."""
        from . import grads

        return grads.clip_grad_norm_(list(parameters), max_norm, norm_type)

    # -- state ------------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The full weights, TP shards gathered along their ``partition_dim``, on every process. Collective."""
        from .weights import full_state_dict

        return full_state_dict(self.unwrap_model(model))

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, Any]) -> Any:
        """Loads full weights (as ``model_state_dict`` returns them); each TP rank keeps its own block."""
        from .weights import load_full_state_dict

        return load_full_state_dict(self.unwrap_model(model), state_dict)

    def save_sharded(self, accelerator: Any, folder: str, **kwargs: Any) -> tuple[str, ...]:
        """accel-checkpoint's ``ShardedCheckpointing``: each TP shard written once (by DP rank 0). Collective."""
        from .checkpointing import save_sharded

        return save_sharded(self, accelerator, folder)

    def load_sharded(self, accelerator: Any, folder: str, allow_unsafe_pickle: bool | None = None, **kwargs: Any) -> None:
        """Restores what ``save_sharded`` wrote; another ``tp_degree`` is a ``CheckpointMismatchError``. Collective."""
        from .checkpointing import load_sharded

        load_sharded(self, accelerator, folder, allow_unsafe_pickle)

    def __repr__(self) -> str:
        return f"MegatronStrategy(tp_degree={self.plugin.tp_degree}, sequence_parallelism={self.plugin.sequence_parallelism})"
