"""The LR scheduler wrapper: steps with the optimizer, as many times as the run's stepping asks.

Scripts written for Accelerate size their schedules from the DataLoader's length *before*
``prepare`` (``total_steps = len(loader) * epochs``). On N processes each one then sees 1/N of
those batches, so by default (``scheduler_stepping="per_process"``, Accelerate's behaviour) each
optimizer step advances the scheduler N times — once with ``split_batches``, where the batch count
does not change — and the schedule ends when training ends. A ``total_steps`` bound
(``OneCycleLR``) is never overrun.

``scheduler_stepping="per_optimizer_step"`` (accel's option: ``Accelerator(scheduler_stepping=...)``,
``accel launch --scheduler-stepping``, the config key ``scheduler_stepping`` or
``ACCEL_SCHEDULER_STEPPING``) steps it exactly once per optimizer step, whatever the number of
processes: write schedules in optimizer steps then,
``total_steps = len(prepared_loader) * epochs // accumulation``.

Either way the scheduler does not step on accumulation micro-steps nor when fp16 skipped the
optimizer step; with ``step_scheduler_with_optimizer=False`` it steps once on every call.
"""

from __future__ import annotations

from typing import Any

from .optimizer import AcceleratedOptimizer
from .state import GradientState, PartialState


class AcceleratedScheduler:
    """Wraps an LR scheduler so ``scheduler.step()`` can be called on every micro-batch.

    step_with_optimizer: when False the scheduler steps once on every call (schedules stepped per
        epoch or by hand).
    split_batches: the loaders split one batch between processes: one scheduler step per optimizer step.
    steps_per_optimizer_step: scheduler steps per optimizer step; ``None`` means Accelerate's rule:
        1 with ``split_batches``, else the number of processes. The Accelerator passes the value
        its ``scheduler_stepping`` gives.

    Example::

        scheduler = AcceleratedScheduler(torch.optim.lr_scheduler.StepLR(optimizer, 10), [accelerated_optimizer])
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: AcceleratedOptimizer | list[AcceleratedOptimizer],
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        steps_per_optimizer_step: int | None = None,
    ) -> None:
        if steps_per_optimizer_step is not None and steps_per_optimizer_step < 1:
            raise ValueError(f"steps_per_optimizer_step must be at least 1, got {steps_per_optimizer_step}.")
        self.scheduler = scheduler
        self.optimizers = list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.steps_per_optimizer_step = steps_per_optimizer_step
        self.gradient_state = GradientState()

    def _steps(self) -> int:
        if self.steps_per_optimizer_step is not None:
            return self.steps_per_optimizer_step
        return 1 if self.split_batches else PartialState().num_processes

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Steps the wrapped scheduler after each real optimizer step (``steps_per_optimizer_step`` times); nothing on
        micro-steps or on fp16-skipped steps."""
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            return  # an accumulation micro-step: the optimizer did not step
        if any(opt.step_was_skipped for opt in self.optimizers):
            return  # fp16 found inf/nan gradients and skipped the step: keep the learning rate
        total = getattr(self.scheduler, "total_steps", None)
        for _ in range(self._steps()):
            # OneCycleLR raises when stepped past total_steps: a loader without drop_last can get there.
            if isinstance(total, int) and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The wrapped scheduler's last learning rates."""
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state dict."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict into the wrapped scheduler."""
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        """The wrapped scheduler's ``get_lr()``."""
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped scheduler's ``print_lr(...)``."""
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Anything else (last_epoch, base_lrs, ...) is the wrapped scheduler's.
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
