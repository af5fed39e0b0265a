"""``FSDPStrategy``: what the Accelerator asks, answered with FSDP2 (``fully_shard``) or FSDP1.

Capabilities it implements (see ``accel_core.strategies.base``): ``WrapsBeforeOptimizer`` (an
optimizer built before ``prepare`` is rebuilt on the sharded parameters), ``BackwardSyncControl``
(``accumulate``/``no_sync`` skip the gradient reduce-scatter), ``ProcessGroupSetup`` (a group of
one for a single process, so FSDP and DCP behave the same there), and accel-checkpoint's
``ShardedCheckpointing`` (``save_sharded``/``load_sharded``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
from accel_core.enums import DistributedType
from accel_core.strategies import Strategy
from accel_core.strategies.groups import join_group_of_one
from torch import nn

from . import checkpointing, fsdp1, fsdp2, grads
from .optimizer import ParameterNames, rebuild
from .plugin import FullyShardedDataParallelPlugin

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
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "fp16", "bf16")
    owns_precision: ClassVar[bool] = False
    launcher: ClassVar[str] = "torchrun"

    def __init__(self, plugin: FullyShardedDataParallelPlugin | None = None) -> None:
        super().__init__()
        if plugin is not None and not isinstance(plugin, FullyShardedDataParallelPlugin):
            raise TypeError(
                f"fsdp_plugin must be an accel_fsdp.FullyShardedDataParallelPlugin, got {type(plugin).__name__}."
            )
        self.plugin = plugin if plugin is not None else FullyShardedDataParallelPlugin()
        self._names = ParameterNames()
        self._mesh: Any = None

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any] | None = None) -> FSDPStrategy:
        """Core's factory: the user's plugin, or one read from the ``ACCEL_FSDP_*`` environment."""
        return cls(plugin if plugin is not None else FullyShardedDataParallelPlugin.from_env())

    @property
    def fsdp_version(self) -> int:
        return self.plugin.fsdp_version

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.FSDP

    # -- process group ----------------------------------------------------------------------
    def init_process_group(self, **kwargs: Any) -> None:
        """With one process, joins a process group of one (in memory): ``fully_shard``, DeviceMesh and
        DCP need a group, and a checkpoint written by many processes then loads the same way on one."""
        join_group_of_one(**kwargs)

    def setup(self, accelerator: Any) -> None:
        super().setup(accelerator)
        if self.fsdp_version == 2 and self.state.is_main_process:
            changed = [k for k, default in _FSDP1_ONLY.items() if getattr(self.plugin, k) != default]
            if changed:
                logger.warning("accel-fsdp: %s only apply to FSDP1 (fsdp_version=1); FSDP2 ignores them.", ", ".join(changed))

    @property
    def device_mesh(self) -> Any:
        """The mesh parameters are sharded over (built on first use; collective)."""
        if self._mesh is None:
            state = self.state
            local = getattr(state, "local_world_size", state.num_processes) or state.num_processes
            from .policies import build_mesh

            self._mesh = build_mesh(self.plugin, state.device.type, state.num_processes, local)
        return self._mesh

    # -- models and optimizers --------------------------------------------------------------
    def prepare_model(self, model: nn.Module, device_placement: bool) -> nn.Module:
        """Shards ``model`` (placement is FSDP's job: parameters go to the mesh's device)."""
        self._names.record(model)
        precision = str(getattr(self.state, "mixed_precision", "no") or "no")
        if self.fsdp_version == 2:
            return fsdp2.shard_model(model, self.plugin, mesh=self.device_mesh, device=self.state.device, accelerator_precision=precision)
        hybrid = self.plugin.sharding_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
        return fsdp1.wrap_model(
            model,
            self.plugin,
            device=self.state.device,
            accelerator_precision=precision,
            mesh=self.device_mesh if hybrid else None,
            is_main_process=self.state.is_main_process,
        )

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        # FSDP2 keeps the user's object (its class gains FSDPModule); FSDP1 wraps it.
        return model.module if fsdp1.is_fsdp1(model) else model

    def rebuild_optimizer(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> torch.optim.Optimizer:
        flat = self.fsdp_version == 1 and not self.plugin.use_orig_params
        return rebuild(optimizer, model, self._names, flat=flat, announce=self.state.is_main_process)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Gradients accumulate unsharded on each process; the next synced backward reduce-scatters the sum."""
        if fsdp2.is_fsdp2(model):
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        elif fsdp1.is_fsdp1(model):
            with model.no_sync():
                yield
        else:
            yield

    def clip_grad_norm_(self, parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips and returns the global norm of the (sharded) gradients, equal to the unsharded model's norm."""
        params = list(parameters)
        if self.fsdp_version == 1:
            wanted = {id(p) for p in params}
            for model in self._prepared_models():
                if fsdp1.is_fsdp1(model) and {id(p) for p in model.parameters()} == wanted:
                    return model.clip_grad_norm_(max_norm, norm_type)
            raise ValueError(
                "With FSDP1, clip_grad_norm_ clips a whole prepared model: pass model.parameters() of the model that "
                "prepare() returned (FSDP2, the default, also clips any subset of parameters)."
            )
        return grads.clip_grad_norm_(params, max_norm, norm_type)

    def _prepared_models(self) -> list[nn.Module]:
        return list(getattr(self.accelerator, "_models", []) or [])

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The full state dict, gathered shard by shard onto process 0's CPU (empty on the others). Collective."""
        return checkpointing.full_model_state_dict(model)

    def load_model_state_dict(self, model: nn.Module, state_dict: dict[str, Any]) -> Any:
        """Loads a full state dict (the same on every process) into the shards. Collective."""
        return checkpointing.load_full_model_state_dict(model, state_dict)

    def make_grad_scaler(self, **kwargs: Any) -> Any:
        """fp16: a ``ShardedGradScaler``, which agrees across processes on whether any shard overflowed."""
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.state.device.type, **kwargs)

    # -- accel-checkpoint's ShardedCheckpointing -------------------------------------------
    def save_sharded(self, accelerator: Any, folder: str, **kwargs: Any) -> tuple[str, ...]:
        """Writes models and optimizers (DCP shards, or gathered for FULL_STATE_DICT). Collective."""
        return checkpointing.save(accelerator, folder, self.plugin.state_dict_type, self.state.is_main_process)

    def load_sharded(self, accelerator: Any, folder: str, allow_unsafe_pickle: bool | None = None, **kwargs: Any) -> None:
        """Restores what ``save_sharded`` wrote, resharding to the current number of processes. Collective."""
        checkpointing.load(accelerator, folder, allow_unsafe_pickle)

    def __repr__(self) -> str:
        return f"FSDPStrategy(version={self.fsdp_version}, sharding={self.plugin.sharding_strategy})"
