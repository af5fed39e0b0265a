"""The opt-in non-finite guard: skip the optimizer step on every process alike when a loss or a gradient is not finite.

``Accelerator(skip_nonfinite=True)`` (or ``ACCEL_SKIP_NONFINITE=1``) gives every prepared
optimizer a ``NonFiniteGuard``. ``accelerator.backward`` records whether each loss is finite (a
device-side flag, no synchronisation); at the accumulation boundary the first optimizer to step
combines that flag with its own check of every prepared optimizer's gradients and all processes
exchange one flag (``all_reduce`` of one number, MAX). Any process's NaN/inf then makes every
process skip the step of every optimizer — one process skipping alone would leave the replicas
different. The LR scheduler does not step either (``optimizer.step_was_skipped``), and the skips
are counted (``accelerator.nonfinite_skips``, logged as ``train/nonfinite_skips``; ``save_state`` keeps
the count, so a resumed run's count continues).

With fp16 the ``GradScaler`` already skips the step when the scaled gradients hold inf/NaN (and
lowers the scale): the guard leaves the gradients to it and checks only the losses, so nothing is
checked twice. Its skips are the scaler's normal work and are not counted here.

Cost: one foreach max-norm of the gradients and one all_reduce of a single number per optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..ops import any_process

LOG_KEY = "train/nonfinite_skips"
"""The name under which ``accelerator.log`` reports the number of skipped steps."""


def _local(grad: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return grad.to_local() if isinstance(grad, DTensor) else grad


class NonFiniteGuard:
    """Decides, once per optimizer step and alike on every process, whether that step must be skipped.

    optimizers: the prepared optimizers (the Accelerator's list, read at each decision).
    device: where the flag is reduced (the process's device: a CUDA tensor for nccl).
    check_gradients: False when an fp16 GradScaler checks the gradients itself.
    """

    def __init__(self, optimizers: Sequence[Any], device: torch.device, check_gradients: bool = True) -> None:
        self.optimizers = optimizers
        self.device = device
        self.check_gradients = check_gradients
        self.skips = 0
        self.logged_skips = 0
        self._loss_bad: torch.Tensor | None = None
        self._decision: bool | None = None

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Records whether ``loss`` is finite (called by ``backward``; losses of accumulation micro-steps add up)."""
        self._next_boundary()
        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad

    def boundary_passed(self) -> None:
        """Called at a real ``zero_grad``: the next decision is about new gradients."""
        self._next_boundary()

    def _next_boundary(self) -> None:
        if self._decision is not None:
            self._decision = None
            self._loss_bad = None

    def should_skip(self) -> bool:
        """Collective (every process, at the same optimizer step): True when any process saw a non-finite value.

        The first optimizer to step at a boundary decides for all of them.
        """
        if self._decision is None:
            self._decision = self._decide()
            if self._decision:
                self.skips += 1
        return self._decision

    def _decide(self) -> bool:
        flag = torch.zeros((), dtype=torch.float32, device=self.device)
        if self._loss_bad is not None:
            flag = flag + self._loss_bad.to(self.device, torch.float32)
        if self.check_gradients:
            grads = [
                _local(p.grad)
                for opt in self.optimizers
                for group in opt.param_groups
                for p in group["params"]
                if p.grad is not None
            ]
            by_place: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for grad in grads:
                if grad.numel():
                    by_place.setdefault((grad.device, grad.dtype), []).append(grad)
            for tensors in by_place.values():
                # The largest magnitude is inf/NaN exactly when some element is (a 2-norm could
                # overflow on finite values); one foreach kernel per device and dtype.
                largest = torch.stack(torch._foreach_norm(tensors, float("inf")))  # as torch's clip_grad_norm_
                flag = flag + (~torch.isfinite(largest).all()).to(self.device, torch.float32)
        return any_process(flag)

    def state_dict(self) -> dict[str, int]:
        """The counts a checkpoint keeps, so that a resumed run's count continues (``training_progress``)."""
        return {"skips": self.skips, "logged_skips": self.logged_skips}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restores ``state_dict()``'s counts: skips made after the checkpoint are made, and counted, again."""
        self.skips = int(state["skips"])
        self.logged_skips = int(state["logged_skips"])

    def unlogged(self) -> dict[str, int]:
        """``{LOG_KEY: count}`` when steps were skipped since the last ``accelerator.log``, else ``{}``."""
        if self.skips == self.logged_skips:
            return {}
        self.logged_skips = self.skips
        return {LOG_KEY: self.skips}
