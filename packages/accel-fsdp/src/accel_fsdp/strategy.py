"""``FSDPStrategy``: what the Accelerator asks, answered with FSDP2 (``fully_shard``) or FSDP1.

What it does differently from the base Strategy (see ``accel_core.strategies.base``):
``replaces_parameters`` with its own ``rebuild_optimizer`` (an optimizer built before ``prepare`` is
rebuilt on the sharded parameters, FSDP1's flat ones included), ``setup_environment`` (a group of one
for a single process, so FSDP and DCP behave the same there); and the optional interfaces
``BackwardSyncControl`` (``accumulate``/``no_sync`` skip the gradient reduce-scatter) and
``HandsOverShardedState`` (``sharded_state``/``load_sharded``: accel-checkpoint writes what it hands over).

On the job's mesh FSDP is the data-parallel transform: ``fully_shard`` over ``dp_shard_cp``, or
over ``(dp_replicate, dp_shard_cp)`` (HSDP) when there are replicas; FSDP2's whole chain is
``parallelize`` (``accel_fsdp.parallelize``), where tensor parallelism composes with it (2-D parameters).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from accel_core.checkpointing import CheckpointIO, ShardedState
from accel_core.enums import DistributedType
from accel_core.grads import clip_grad_norm_
from accel_core.optimizer_rebuild import ParameterNames, rebuild
from accel_core.parallel.config import SIZE_FIELDS, ParallelismConfig, resolve_parallelism
from accel_core.parallel.dims import adopt_mesh
from accel_core.precision.choice import default_precision
from accel_core.precision.modes import Precision, PrecisionContext
from accel_core.prepared_model import ModelParts, PreparedModel
from accel_core.strategies import PreparedObjects, Strategy, StrategyContext
from accel_core.strategies.ddp import data_parallel_no_sync
from accel_core.strategies.groups import join_group_of_one

from . import checkpointing, fsdp1
from .plugin import FullyShardedDataParallelPlugin

if TYPE_CHECKING:
    from accel_core.settings import RunSettings

logger = logging.getLogger("accel_fsdp")

_FSDP1_ONLY = {
    "backward_prefetch": None,
    "forward_prefetch": False,
    "limit_all_gathers": True,
    "use_orig_params": True,
}


class FSDPStrategy(Strategy):
    """Fully sharded data parallelism: each process holds a shard of every parameter, gradient and
    optimizer state, and gathers full parameters one unit at a time for forward and backward.

    Chosen by ``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(...))``, by ``accel launch
    --use-fsdp`` or ``strategy: fsdp`` in the config file (settings then come from ``ACCEL_FSDP_*``).

    Example::

        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap",
                                                                             min_num_params=1_000_000))
        model, optimizer = accelerator.prepare(model, optimizer)  # optimizer rebuilt on the shards
    """

    name: ClassVar[str] = "fsdp"
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "fp16", "bf16", "fp8")
    data_parallel_dim: ClassVar[str] = "dp_shard"
    replaces_parameters: ClassVar[bool] = True  # sharding always makes new parameters (DTensors, flat parameters)

    def __init__(self, plugin: FullyShardedDataParallelPlugin | None = None) -> None:
        super().__init__()
        if plugin is not None and not isinstance(plugin, FullyShardedDataParallelPlugin):
            raise TypeError(
                f"fsdp_plugin must be an accel_fsdp.FullyShardedDataParallelPlugin, got {type(plugin).__name__}."
            )
        self.plugin = plugin if plugin is not None else FullyShardedDataParallelPlugin()

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any], settings: RunSettings) -> FSDPStrategy:
        """Core's factory: the user's plugin, or one read from the settled ``ACCEL_FSDP_*`` variables."""
        return cls(plugin if plugin is not None else FullyShardedDataParallelPlugin.from_env(settings.environ))

    @property
    def fsdp_version(self) -> int:
        return self.plugin.fsdp_version

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.FSDP

    # -- layout -----------------------------------------------------------------------------
    def parallelism(self, requested: ParallelismConfig | None, settings: RunSettings) -> tuple[ParallelismConfig, Any]:
        """Parameters shard over the processes no other size claims (``dp_shard``). The plugin may
        describe the layout instead: its ``device_mesh`` (adopted as the job's mesh, so data is sharded
        over its data-parallel dimensions only), or HYBRID_SHARD (machines x processes per machine)."""
        world_size, local_world_size = settings.world_size, settings.local_world_size
        sizes_given = requested is not None and any(getattr(requested, name) is not None for name in SIZE_FIELDS)
        base = requested if requested is not None else ParallelismConfig()
        if self.plugin.device_mesh is not None:
            if sizes_given:
                raise ValueError(
                    "Pass the layout once: either FullyShardedDataParallelPlugin(device_mesh=...) or the sizes of "
                    "parallelism_config, not both."
                )
            described, mesh = adopt_mesh(self.plugin.device_mesh, world_size)
            config = dataclasses.replace(base, **{name: getattr(described, name) for name in SIZE_FIELDS})
            self.check_parallelism(config)
            return config, mesh
        if self.plugin.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2") and not sizes_given:
            if local_world_size < 1 or world_size % local_world_size:
                raise ValueError(
                    f"sharding_strategy={self.plugin.sharding_strategy} needs the same number of processes on every "
                    f"machine ({world_size} processes, {local_world_size} on this one); pass "
                    "parallelism_config=ParallelismConfig(dp_replicate_size=..., dp_shard_size=...) to choose."
                )
            base = dataclasses.replace(
                base, dp_replicate_size=world_size // local_world_size, dp_shard_size=local_world_size
            )
        config = resolve_parallelism(base, world_size, data_parallel_dim="dp_shard", environ=settings.environ)
        self.check_parallelism(config)
        return config, None

    def make_precision(self, name: str, context: PrecisionContext) -> Precision:
        """Core's precisions, with a ``ShardedGradScaler`` for fp16 (it agrees across processes on whether any shard
        overflowed). fp8 (accel-fp8's layers, gathered in float8) needs FSDP2: FSDP1's flat parameters cannot hold
        them."""
        if name == "fp8" and self.fsdp_version == 1:
            raise ValueError(
                "mixed_precision='fp8' with FSDP needs FSDP2: use FullyShardedDataParallelPlugin(fsdp_version=2)."
            )
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return default_precision(name, context, grad_scaler=ShardedGradScaler)

    def check_parallelism(self, config: ParallelismConfig) -> None:
        """FSDP2 composes with every dimension; FSDP1 only with data parallelism."""
        if self.fsdp_version == 1 and (config.tp_enabled or config.cp_enabled or config.pp_enabled):
            raise ValueError(
                f"tp_size={config.size('tp')}, cp_size={config.size('cp')}, pp_size={config.size('pp')} need FSDP2 "
                "(DTensor parameters, one FSDPModule per pipeline stage); "
                "FullyShardedDataParallelPlugin(fsdp_version=1) cannot compose with them. Use fsdp_version=2."
            )

    # -- process group ----------------------------------------------------------------------
    def setup_environment(self, settings: RunSettings, **kwargs: Any) -> None:
        """With one process, joins a process group of one (in memory): ``fully_shard``, DeviceMesh and
        DCP need a group, and a checkpoint written by many processes then loads the same way on one."""
        join_group_of_one(settings.world_size, **kwargs)

    def setup(self, context: StrategyContext) -> None:
        super().setup(context)
        if self.fsdp_version == 2 and context.state.is_main_process:
            changed = [k for k, default in _FSDP1_ONLY.items() if getattr(self.plugin, k) != default]
            if changed:
                logger.warning(
                    "accel-fsdp: %s only apply to FSDP1 (fsdp_version=1); FSDP2 ignores them.", ", ".join(changed)
                )

    @property
    def device_mesh(self) -> Any:
        """The mesh parameters are sharded over: ``dp_shard_cp``, or ``(dp_replicate, dp_shard_cp)`` with replicas."""
        dims = self.context.dims
        if not dims.config.dp_replicate_enabled:
            return dims.submesh("dp_shard_cp")
        return dims.submesh("dp_replicate", "dp_shard_cp" if dims.config.cp_enabled else "dp_shard")

    # -- models and optimizers --------------------------------------------------------------
    def parallelize(self, model: nn.Module, device_placement: bool) -> ModelParts:
        """FSDP2: its own chain, ``fully_shard`` included (``accel_fsdp.parallelize``; placement is FSDP's job:
        parameters go to the mesh's device). FSDP1: core's default chain, whose data-parallel step is
        ``prepare_model``."""
        if self.fsdp_version == 1:
            return super().parallelize(model, device_placement)
        from .parallelize import parallelize_fsdp2

        return parallelize_fsdp2(model, self.plugin, self.context, self.device_mesh)

    def prepare_model(self, model: nn.Module, device_placement: bool) -> nn.Module:
        """FSDP1's wrapper around ``model``, the data-parallel step of core's default chain."""
        context = self.context
        hybrid = self.plugin.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
        return fsdp1.wrap_model(
            model,
            self.plugin,
            device=context.device,
            precision=context.precision,
            mesh=context.dims.submesh("dp_replicate", "dp_shard") if hybrid else None,
            is_main_process=context.state.is_main_process,
        )

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """None: core's default chain, which only FSDP1 runs, checkpoints and compiles its model as a whole (FSDP1's
        wrapper). FSDP2's chain (``accel_fsdp.parallelize``) takes its blocks from the plugin's wrap policy."""
        return []

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        # FSDP2 keeps the user's object (its class gains FSDPModule); FSDP1 wraps it.
        return model.module if fsdp1.is_fsdp1(model) else model

    def listed_model(self, prepared: PreparedModel) -> nn.Module:
        """The sharded model, as the reference lists it in ``_models`` and gives it to the state hooks: FSDP1's
        wrapper (FSDP2's is the user's object itself), outside any ``torch.compile`` wrapper."""
        return prepared.wrapped

    def rebuild_optimizer(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, names: ParameterNames
    ) -> torch.optim.Optimizer:
        flat = self.fsdp_version == 1 and not self.plugin.use_orig_params
        return rebuild(
            optimizer, model, names, flat=flat, announce=self.state.is_main_process, log=logger, who="accel-fsdp"
        )

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Gradients accumulate unsharded on each process; the next synced backward reduce-scatters the sum."""
        if fsdp1.is_fsdp1(model):
            return model.no_sync()
        return data_parallel_no_sync(model)  # FSDP2's FSDPModule (any other model runs the block as it is)

    def clip_grad_norm_(
        self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clips and returns the global norm of the (sharded) gradients, equal to the unsharded model's norm."""
        params = list(parameters)
        if self.fsdp_version == 1:
            wanted = {id(p) for p in params}
            for model in self.context.prepared.models:
                if fsdp1.is_fsdp1(model) and {id(p) for p in model.parameters()} == wanted:
                    return model.clip_grad_norm_(max_norm, norm_type)
            raise ValueError(
                "With FSDP1, clip_grad_norm_ clips a whole prepared model: pass model.parameters() of the model that "
                "prepare() returned (FSDP2, the default, also clips any subset of parameters)."
            )
        dims = self.context.dims
        pipeline = dims.group("pp") if dims.config.pp_enabled else None
        return clip_grad_norm_(params, max_norm, norm_type, pipeline)

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The full state dict, gathered shard by shard onto process 0's CPU (empty on the others). Collective."""
        return checkpointing.full_model_state_dict(model)

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> Any:
        """Loads a full state dict (the same on every process) into the shards. Collective."""
        return checkpointing.load_full_model_state_dict(model, state_dict, strict=strict)

    # -- HandsOverShardedState -----------------------------------------------------------------
    def sharded_state(self, prepared: PreparedObjects, **kwargs: Any) -> ShardedState:
        """Models and optimizers for accel-checkpoint to write (DCP shards, or gathered for FULL_STATE_DICT).
        Collective."""
        return checkpointing.sharded_state(prepared, self.plugin.state_dict_type, self.context.state.is_main_process)

    def load_sharded(
        self,
        prepared: PreparedObjects,
        folder: str,
        *,
        io: CheckpointIO,
        allow_unsafe_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Restores what accel-checkpoint wrote of ``sharded_state``, resharding to the current layout (DCP), reading
        through ``io``. Collective."""
        checkpointing.load(prepared, folder, io)

    def __repr__(self) -> str:
        return f"FSDPStrategy(version={self.fsdp_version}, sharding={self.plugin.sharding_strategy})"
