"""What ``prepare`` returns for DeepSpeed's optimizer and scheduler, so the user's loop is unchanged.

The engine owns the optimizer step: it knows its accumulation boundaries, zeroes gradients after
stepping and clips by its config. ``optimizer.step()`` therefore calls ``engine.step()`` on every
micro-step (the engine only updates at a boundary, and counts the micro-steps),
``optimizer.zero_grad()`` does nothing, and ``scheduler.step()`` does nothing when the engine steps
the scheduler itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accel_core.optimizer import AcceleratedOptimizer
from accel_core.scheduler import AcceleratedScheduler

if TYPE_CHECKING:
    import torch
    from deepspeed import DeepSpeedEngine


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """The optimizer ``prepare`` returns under DeepSpeed: steps through the engine.

    ``step_was_skipped`` is True after a boundary step that DeepSpeed skipped (fp16 overflow).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, engine: DeepSpeedEngine) -> None:
        super().__init__(optimizer)
        self.engine = engine

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Does nothing: the engine zeroes gradients right after its boundary step."""
        # The engine zeroes gradients right after its boundary step; zeroing here would drop
        # gradients accumulated over micro-steps.
        return None

    def step(self, closure: Any = None) -> None:
        """Runs the engine's step (a real optimizer step only at accumulation boundaries)."""
        if closure is not None:
            raise ValueError("DeepSpeed's optimizer step does not take a closure: call optimizer.step() without one.")
        at_boundary = self.engine.is_gradient_accumulation_boundary()
        self.engine.step()
        self._step_was_skipped = bool(at_boundary and not self.engine.was_step_applied())
        if at_boundary and self.on_step is not None:
            self.on_step()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict into DeepSpeed's optimizer, which places (partitions, offloads) it itself."""
        # DeepSpeed's optimizers place the state themselves (partitions, offload); no device move here.
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"DeepSpeedOptimizerWrapper({type(self.optimizer).__name__})"


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """The scheduler ``prepare`` returns when the engine steps it (config ``scheduler`` or a DeepSpeed
    scheduler class): ``step()`` does nothing, the engine steps it at each accumulation boundary."""

    def __init__(self, scheduler: Any, optimizers: list[AcceleratedOptimizer]) -> None:
        super().__init__(scheduler, optimizers, step_with_optimizer=True)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Does nothing: the engine steps this scheduler at each accumulation boundary."""
        return None

    def get_last_lr(self) -> list[float]:
        """The engine-stepped scheduler's last learning rates."""
        getter = getattr(self.scheduler, "get_last_lr", None)
        if getter is not None:
            return getter()
        return [group["lr"] for group in self.optimizers[0].param_groups] if self.optimizers else []
