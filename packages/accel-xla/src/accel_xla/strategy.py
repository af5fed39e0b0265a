"""The ``xla`` strategy: data parallelism over XLA replicas (TPU cores, or any device of torch-xla's PJRT runtime).

Capabilities it implements (see ``accel_core.strategies.base``):

- ``ProcessGroupSetup``: processes started by torchrun join torch.distributed's ``xla`` backend
  (``init_method="xla://"``, the way torch-xla documents torchrun); one process needs nothing.
- ``PlacesProcess``: ordinal, replica count, local ordinal and device come from the PJRT runtime,
  and accel's gather / reduce / broadcast / barrier go through XLA collectives (``XlaCollectives``).
- ``BatchTransfer``: prepared dataloaders are read through torch-xla's ``MpDeviceLoader``
  (``XlaDeviceLoader``), which uploads batches ahead and marks an XLA step per batch.
- ``ReducesGradients``: the gradients are averaged over the replicas (``xm.all_reduce``) right
  before each real optimizer step, as ``xm.optimizer_step`` does; clipping reduces first, once.
- ``ShardedCheckpointing``: ``save_state`` writes models and optimizers with ``xm.save`` (moved to
  the CPU, written by the master ordinal) into the checkpoint's ``sharded/`` folder.

Moving a model to the XLA device creates new parameter objects; an optimizer built before
``prepare`` is rebuilt on them by core (matched by name). Mixed precision: ``bf16`` (autocast on
the XLA device); ``downcast_bf16`` (``accel launch --downcast-bf16``) also stores float32 tensors
as bfloat16 on the device (torch-xla's ``XLA_DOWNCAST_BF16``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from typing import Any, ClassVar

import torch

from accel_core import environment as env
from accel_core.enums import DistributedType
from accel_core.parallelism import ParallelismConfig
from accel_core.placement import ProcessPlacement
from accel_core.strategies import PreparedObjects, Strategy

from .collectives import XlaCollectives
from .loader import XlaDeviceLoader
from .runtime import TorchXla, require_torch_xla

DOWNCAST_BF16 = "ACCEL_XLA_DOWNCAST_BF16"
"""Set by ``accel launch --downcast-bf16`` (Accelerate's ``ACCELERATE_DOWNCAST_BF16`` is read too)."""
DEVICE = "ACCEL_XLA_DEVICE"
"""The PJRT device (TPU, CPU, CUDA) from ``accel launch --xla-device`` or the config file's ``xla: device:``."""


def downcast_requested(environ: dict[str, str] | None = None) -> bool:
    """Whether the environment asks for bf16 downcasting (``ACCEL_XLA_DOWNCAST_BF16`` or Accelerate's variable)."""
    environ = dict(os.environ) if environ is None else environ
    return env.parse_flag(environ.get(DOWNCAST_BF16)) or bool(environ.get("ACCELERATE_DOWNCAST_BF16"))


def _tree_to_cpu(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.detach().cpu()
    if isinstance(data, dict):
        return {k: _tree_to_cpu(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_tree_to_cpu(v) for v in data)
    return data


class XlaStrategy(Strategy):
    """Replicas of the model on every XLA device, gradients averaged by XLA collectives.

    downcast_bf16: with ``mixed_precision="bf16"``, store float32 tensors as bfloat16 on the
        device too (default: ``ACCEL_XLA_DOWNCAST_BF16``).

    Example::

        accelerator = Accelerator(strategy="xla", mixed_precision="bf16")
    """

    name: ClassVar[str] = "xla"
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "bf16")

    def __init__(self, downcast_bf16: bool | None = None, xla: TorchXla | None = None) -> None:
        super().__init__()
        self.downcast_bf16 = downcast_requested() if downcast_bf16 is None else bool(downcast_bf16)
        self._xla = xla
        # Gradients already averaged since the last optimizer step (by clipping), by identity.
        self._reduced: set[int] = set()

    @property
    def xla(self) -> TorchXla:
        """torch_xla's modules (imported on first use, with the install command when missing)."""
        if self._xla is None:
            self._xla = require_torch_xla()
        return self._xla

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any]) -> XlaStrategy:
        """The xla strategy takes no plugin; ``downcast_bf16`` comes from the environment."""
        if plugin is not None:
            raise TypeError(f"The xla strategy takes no plugin, got {type(plugin).__name__}.")
        return cls()

    # -- layout and precision ------------------------------------------------------------------
    def check_parallelism(self, config: ParallelismConfig) -> None:
        """Data parallelism only: SPMD sharding (``dp_shard`` / ``tp`` as ``xs.mark_sharding``) is not built yet."""
        others = [f"{dim}_size={config.size(dim)}" for dim in ("dp_shard", "cp", "tp", "pp") if config.size(dim) > 1]
        if others:
            raise ValueError(
                f"{', '.join(others)}: the xla strategy runs data parallelism over replicas only (dp_replicate); "
                "sharding over XLA devices (SPMD, FSDPv2) is not available in accel-xla yet. Drop those sizes."
            )

    def resolve_precision(self, requested: str) -> str:
        """``requested``; ValueError when ``downcast_bf16`` is asked for without ``mixed_precision="bf16"``."""
        if self.downcast_bf16 and requested != "bf16":
            raise ValueError("Can only use `downcast_bf16` when using `mixed_precision='bf16'` and on a TPU")
        return requested

    # -- processes ------------------------------------------------------------------------------
    def init_process_group(self, **kwargs: Any) -> None:
        """Joins torch.distributed's ``xla`` backend when torchrun started several processes.

        Sets ``XLA_DOWNCAST_BF16`` first when downcasting, before the runtime creates any tensor.
        """
        # Read by torch-xla when its runtime starts: set before anything touches the device. ACCEL_XLA_DEVICE is the
        # config file's `xla: device:` (the --xla-device flag sets PJRT_DEVICE itself).
        device = os.environ.get(DEVICE)
        if device and not os.environ.get("PJRT_DEVICE"):
            os.environ["PJRT_DEVICE"] = device.upper()
        if self.downcast_bf16:
            os.environ["XLA_DOWNCAST_BF16"] = "1"
        _ = self.xla  # a missing or mismatched torch-xla fails here, before any process joins
        if (env.get_int(env.WORLD_SIZE, 1) or 1) > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                import importlib

                importlib.import_module("torch_xla.distributed.xla_backend")  # registers the "xla" backend
                dist.init_process_group("xla", init_method="xla://", **kwargs)

    def process_placement(self) -> ProcessPlacement:
        """This process's place as PJRT reports it, with XLA collectives."""
        xr = self.xla.xr
        device = self.xla.torch_xla.device()
        local_world = max(int(xr.local_process_count()), 1)
        return ProcessPlacement(
            device=device,
            world_size=int(xr.world_size()),
            rank=int(xr.global_ordinal()),
            local_rank=int(xr.local_ordinal()),
            local_world_size=max(local_world * int(xr.addressable_device_count()), 1),
            backend="xla",
            collectives=XlaCollectives(self.xla),
        )

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.XLA

    # -- steps ------------------------------------------------------------------------------------
    def mark_step(self) -> None:
        """Runs the XLA graph recorded so far (``torch_xla.sync()``)."""
        self.xla.torch_xla.sync()

    def wrap_dataloader(self, dataloader: Any) -> XlaDeviceLoader:
        """The prepared loader read through torch-xla's ``MpDeviceLoader`` onto this process's device."""
        return XlaDeviceLoader(dataloader, self.context.device, self.xla)

    def _reduce(self, gradients: list[torch.Tensor]) -> None:
        pending = [g for g in gradients if id(g) not in self._reduced]
        world = self.state.num_processes
        if pending and world > 1:
            # In place on a list (xm.all_reduce of a single tensor would return a new one).
            self.xla.xm.all_reduce("sum", pending, scale=1.0 / world)
        self._reduced.update(id(g) for g in pending)

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Averages over the replicas the gradients of ``optimizer``'s parameters not averaged yet (clipping does
        it first); called by the prepared optimizer right before a real step."""
        gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._reduce(gradients)
        self._reduced.clear()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """Averages the gradients over the replicas first (the norm is the global one), then clips."""
        parameters = list(parameters)
        self._reduce([p.grad for p in parameters if p.grad is not None])
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        """Averages the gradients over the replicas first, then clips each value."""
        parameters = list(parameters)
        self._reduce([p.grad for p in parameters if p.grad is not None])
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- state ------------------------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The model's state dict on the CPU (the pending step runs first)."""
        self.mark_step()
        return _tree_to_cpu(self.unwrap_model(model).state_dict())

    def save_sharded(self, prepared: PreparedObjects, folder: str, **kwargs: Any) -> Collection[str]:
        """Writes ``model_<i>.bin`` and ``optimizer_<i>.bin`` into ``folder`` with ``xm.save`` (CPU copies, by the
        master ordinal of the whole job), after running the pending step."""
        if kwargs:
            raise TypeError(f"save_state: the xla strategy takes no save options, got {sorted(kwargs)}.")
        self.mark_step()
        xm = self.xla.xm
        if self.state.is_main_process:
            os.makedirs(folder, exist_ok=True)
        for i, model in enumerate(prepared.models):
            xm.save(self.unwrap_model(model).state_dict(), os.path.join(folder, f"model_{i}.bin"), global_master=True)
        for i, optimizer in enumerate(prepared.optimizers):
            xm.save(optimizer.state_dict(), os.path.join(folder, f"optimizer_{i}.bin"), global_master=True)
        self.state.wait_for_everyone()
        return {"models", "optimizers"}

    def load_sharded(self, prepared: PreparedObjects, folder: str, **kwargs: Any) -> None:
        """Loads what ``save_sharded`` wrote: weights into the models, state into the optimizers (onto the device).

        allow_unsafe_pickle: read the files with full pickle (``load_state(..., allow_unsafe_pickle=True)``);
            by default only tensors and plain values load.
        """
        safe = not kwargs.get("allow_unsafe_pickle", False)
        for i, model in enumerate(prepared.models):
            state = torch.load(os.path.join(folder, f"model_{i}.bin"), map_location="cpu", weights_only=safe)
            self.unwrap_model(model).load_state_dict(state)
        for i, optimizer in enumerate(prepared.optimizers):
            state = torch.load(os.path.join(folder, f"optimizer_{i}.bin"), map_location="cpu", weights_only=safe)
            optimizer.load_state_dict(state)
        self.mark_step()
