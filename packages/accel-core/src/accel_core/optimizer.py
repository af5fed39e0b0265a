"""The optimizer wrapper: steps only at accumulation boundaries, through the precision's scaler."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .ops import send_to_device
from .precision.modes import Precision
from .state import GradientState

if TYPE_CHECKING:
    from .accelerator.nonfinite_guard import NonFiniteGuard


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a user's optimizer so the same loop works with and without accumulation or fp16.

    ``step()`` and ``zero_grad()`` do nothing on accumulation micro-steps (when
    ``accelerator.sync_gradients`` is False). With fp16 the step goes through the GradScaler and
    ``step_was_skipped`` tells whether inf/nan gradients made it skip. ``guard``: the
    Accelerator's ``NonFiniteGuard`` (``skip_nonfinite=True``), asked before each real step.
    """

    # Deliberately no super().__init__: this object shares the wrapped optimizer's state instead of
    # owning parameters. Subclassing keeps ``isinstance(opt, torch.optim.Optimizer)`` true for LR schedulers.
    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        precision: Precision | None = None,
        device: torch.device | None = None,
        reduce_gradients: Callable[[torch.optim.Optimizer], None] | None = None,
    ):
        self.optimizer = optimizer
        self.precision = precision or Precision()
        self.device = device
        # The strategy's cross-process gradient reduction (``strategies.ReducesGradients``), run before a real step.
        self.reduce_gradients = reduce_gradients
        self.gradient_state = GradientState()
        self._step_was_skipped = False
        self.guard: NonFiniteGuard | None = None
        # Told of each real step (the Accelerator counts completed steps and takes periodic checkpoints).
        self.on_step: Callable[[], None] | None = None

    @property
    def scaler(self) -> Any:
        """The fp16 GradScaler the optimizer steps through, or None."""
        return self.precision.scaler

    @property
    def state(self) -> Any:
        """The wrapped optimizer's ``state``."""
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]  # forwards to the wrapped optimizer
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's ``param_groups``."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:  # pyright: ignore[reportIncompatibleVariableOverride]  # forwards to the wrapped optimizer
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's ``defaults``."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Adds a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict into the wrapped optimizer, its tensors moved to the prepared device."""
        if self.device is not None:
            state_dict = send_to_device(state_dict, self.device)
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradients, except on accumulation micro-steps (gradients keep adding up until the boundary)."""
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)
            if self.guard is not None:
                self.guard.boundary_passed()

    # Returns None, as the reference's wrapper does, not the closure's loss.
    def step(self, closure: Any = None) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Steps the wrapped optimizer at accumulation boundaries (through the GradScaler with fp16); nothing on
        micro-steps."""
        if not self.gradient_state.sync_gradients:
            return
        if self.reduce_gradients is not None:
            self.reduce_gradients(self.optimizer)
        if self.guard is not None and self.guard.should_skip():
            # A skipped step still ends its accumulation window, as an fp16 skip does (on_step below).
            self.precision.skip_step(self.optimizer)
            self._step_was_skipped = True
        else:
            kwargs = {} if closure is None else {"closure": closure}
            self._step_was_skipped = self.precision.optimizer_step(self.optimizer, **kwargs)
        if self.on_step is not None:
            self.on_step()

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last real step was skipped: inf/nan gradients (fp16), or a non-finite loss or gradient
        on any process (``skip_nonfinite``)."""
        return self._step_was_skipped

    def train(self) -> None:
        """For optimizers with train/eval modes (schedule-free)."""
        train = getattr(self.optimizer, "train", None)
        if train is not None:
            train()

    def eval(self) -> None:
        """Switches a schedule-free optimizer to evaluation mode (the wrapped optimizer's ``eval()``)."""
        evaluate = getattr(self.optimizer, "eval", None)
        if evaluate is not None:
            evaluate()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["on_step"] = None  # the Accelerator's, not part of the optimizer
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


def unwrap_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The user's optimizer inside an ``AcceleratedOptimizer`` (a backend's subclass included); any other as it is.

    Both have the same ``state_dict``; ``torch.distributed.checkpoint``'s optimizer functions need the user's
    one, whose ``param_groups`` hold the model's (sharded) parameters.
    """
    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer
