"""The LR scheduler wrapper: one scheduler step per real optimizer step.

Accelerate steps a scheduler ``num_processes`` times per call (to keep a schedule written in
per-process batches aligned with the data), which silently shortens warm-ups when the process
count changes. accel steps it exactly once per optimizer step that really happened: not on
accumulation micro-steps, not when fp16 skipped the step, whatever the number of processes. Write
schedules in optimizer steps: ``total_steps = len(prepared_loader) * epochs // accumulation``.
"""

from __future__ import annotations

from typing import Any

from .optimizer import AcceleratedOptimizer
from .state import GradientState


class AcceleratedScheduler:
    """Wraps an LR scheduler so ``scheduler.step()`` can be called on every micro-batch.

    step_with_optimizer: when False the scheduler steps on every call (schedules stepped per epoch
    or by hand).
    """

    def __init__(self, scheduler: Any, optimizers: list[AcceleratedOptimizer], step_with_optimizer: bool = True):
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.step_with_optimizer = step_with_optimizer
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.step_with_optimizer:
            if not self.gradient_state.sync_gradients:
                return
            if any(opt.step_was_skipped for opt in self.optimizers):
                return
        self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Anything else (last_epoch, base_lrs, ...) is the wrapped scheduler's.
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
