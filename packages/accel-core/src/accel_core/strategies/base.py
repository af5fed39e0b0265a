"""The Strategy protocol: the questions the Accelerator asks a backend, and nothing about which backend.

A ``Strategy`` answers the questions every backend must answer (how to wrap a model, how to run
backward, how to clip, how to unwrap, which group the data is sharded over). Optional powers are
small protocols a strategy may also implement; the Accelerator checks for the capability, never for
a backend's name:

- ``JointPreparation``: model + optimizer (+ scheduler, dataloader batch size) prepared in one call
  (DeepSpeed's ``initialize``, Megatron).
- ``WrapsBeforeOptimizer``: the model must be wrapped before its optimizer exists, so an optimizer
  built earlier is rebuilt on the new parameters (FSDP).
- ``BackwardSyncControl``: skip gradient synchronisation while accumulating (DDP, FSDP).
- ``OwnsOptimizerStep``: the backend steps and zeroes at accumulation boundaries itself (DeepSpeed).
- ``ProcessGroupSetup``: join the process group its own way (deepspeed.comm, XLA, Megatron groups).
- ``BatchTransfer``: a device loader / step marker for batches (XLA).
- ``PreparesOwnTypes``: ``prepare`` also takes objects of the backend's own types (DeepSpeed's LR schedules).
- ``ConvertsOwnTypes``: in a separate (not joint) preparation, such an object is first turned into
  the torch object that stands for it (Megatron's dummy scheduler into an LR scheduler).

Sharded checkpointing is a protocol of accel-checkpoint, found by duck typing on the strategy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import torch

from ..enums import DistributedType

if TYPE_CHECKING:
    import torch.distributed as dist

    from ..accelerator import Accelerator
    from ..state import AcceleratorState


class Strategy:
    """Base class with the single-process answers; subclasses override what differs.

    Class attributes:
        name: the ``accel.strategies`` entry-point name.
        supported_precisions: the ``mixed_precision`` values the strategy accepts.
        owns_precision: the backend applies mixed precision itself (no autocast or GradScaler from core).
        launcher: which launcher starts its processes ("torchrun", "deepspeed", "xla-spawn").
    """

    name: ClassVar[str] = "base"
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "fp16", "bf16", "fp8")
    owns_precision: ClassVar[bool] = False
    launcher: ClassVar[str] = "torchrun"

    def __init__(self) -> None:
        self.accelerator: Accelerator | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def setup(self, accelerator: Accelerator) -> None:
        """Called once when the Accelerator adopts the strategy, after the process state exists."""
        self.accelerator = accelerator

    @property
    def state(self) -> AcceleratorState:
        assert self.accelerator is not None, "strategy used before setup()"
        return self.accelerator.state

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.NO

    # -- data parallelism -------------------------------------------------------------------
    @property
    def data_parallel_size(self) -> int:
        """How many different batches are processed per step (dataloaders shard over this)."""
        return self.state.num_processes

    @property
    def data_parallel_rank(self) -> int:
        return self.state.process_index

    @property
    def data_parallel_group(self) -> dist.ProcessGroup | None:
        """The group dataloaders shard over; None means the whole world."""
        return None

    # -- models and optimizers --------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        """Moves the model to the device (and wraps it, in distributed strategies)."""
        if device_placement:
            model = model.to(self.state.device)
        return model

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Returns the user's module from inside whatever ``prepare_model`` wrapped it in."""
        return model

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clips to ``max_norm`` and returns the total norm of all gradients (global, across shards)."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The full (unsharded) state dict of a prepared model, valid at least on the main process."""
        return self.unwrap_model(model).state_dict()

    def make_grad_scaler(self, **kwargs: Any) -> Any:
        """The GradScaler for fp16 (sharded strategies return a sharded one)."""
        return torch.amp.GradScaler(self.state.device.type, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@runtime_checkable
class BackwardSyncControl(Protocol):
    """Gradient synchronisation can be skipped on accumulation micro-steps."""

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]: ...


@runtime_checkable
class JointPreparation(Protocol):
    """The backend prepares model, optimizer, scheduler (and needs the batch size) in one call.

    ``prepare_jointly`` receives every object passed to ``prepare`` (dataloaders already prepared)
    and returns replacements in the same order.
    """

    def prepare_jointly(self, objects: list[Any]) -> list[Any]: ...


@runtime_checkable
class WrapsBeforeOptimizer(Protocol):
    """Wrapping replaces parameters: optimizers built before ``prepare`` must be rebuilt on the new ones."""

    def rebuild_optimizer(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer: ...


@runtime_checkable
class OwnsOptimizerStep(Protocol):
    """The backend steps the optimizer and zeroes gradients at accumulation boundaries itself."""

    def owns_optimizer_step(self) -> bool: ...


@runtime_checkable
class ProcessGroupSetup(Protocol):
    """The backend joins the process group its own way before ``PartialState`` would."""

    def init_process_group(self, **kwargs: Any) -> None: ...


@runtime_checkable
class BatchTransfer(Protocol):
    """The backend moves batches to its device itself and marks step boundaries (XLA)."""

    def wrap_dataloader(self, dataloader: Any) -> Any: ...

    def mark_step(self) -> None: ...


@runtime_checkable
class PreparesOwnTypes(Protocol):
    """``prepare`` also accepts objects of the backend's own types, which are not torch ones
    (DeepSpeed's LR schedule classes); they reach ``prepare_jointly`` like the others."""

    def accepts_object(self, obj: Any) -> bool: ...


@runtime_checkable
class ConvertsOwnTypes(Protocol):
    """For a strategy that prepares objects separately: each object ``accepts_object`` took is first
    replaced by ``convert_object(obj)``, a torch object (an LR scheduler, say) that ``prepare`` then
    prepares like the user's own."""

    def convert_object(self, obj: Any) -> Any: ...
