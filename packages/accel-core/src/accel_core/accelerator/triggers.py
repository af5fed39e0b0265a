"""The Accelerator's cross-rank triggers: one process raises a flag, every process sees it.

``set_trigger`` / ``check_trigger`` stop all processes together (early stopping, a NaN loss on
one rank) without a hang; ``trigger_sync_in_backward`` forces DDP's gradient all-reduce in the
next backward after forwards run under ``no_sync``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

from .. import ops

if TYPE_CHECKING:
    from ..state import AcceleratorState


class Triggers:
    """Mixin of the Accelerator: a flag any process can set and all processes check together."""

    state: AcceleratorState
    flag_tensor: torch.Tensor | None = None

    def set_trigger(self) -> None:
        """Raises the flag on this process; the next ``check_trigger()`` is True on every process.

        Example::

            if torch.isnan(loss):
                accelerator.set_trigger()
            if accelerator.check_trigger():  # on every process, every step
                break
        """
        self.flag_tensor = torch.tensor(1, device=self.state.device)

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger()`` since the last check (then the flag is lowered).

        A collective: every process must call it at the same point.
        """
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.state.device)
        raised = ops.reduce(self.flag_tensor, reduction="sum")
        if raised.item() >= 1:
            self.flag_tensor = torch.tensor(0, device=self.state.device)
            return True
        return False

    @staticmethod
    @contextlib.contextmanager
    def trigger_sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
        """The backward inside the block all-reduces gradients, even after forwards run under ``no_sync``.

        Gradients accumulated locally meanwhile are averaged along. A no-op for a model that is not
        ``DistributedDataParallel`` (one process, FSDP, DeepSpeed).

        Example::

            with accelerator.no_sync(model):
                loss_a = loss_fn(model(input_a))
                loss_b = loss_fn(model(input_b))
            accelerator.backward(loss_a)  # stays local
            with accelerator.trigger_sync_in_backward(model):
                accelerator.backward(loss_b)  # all-reduces the sum of both
        """
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        saved: Any = (model.require_backward_grad_sync, model.require_forward_param_sync)
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        # The forward ran under no_sync, so DDP's reducer was not armed for this backward: arm it.
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved
