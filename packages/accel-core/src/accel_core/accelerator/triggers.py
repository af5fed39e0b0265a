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
    from .process_control import ProcessControl


class Trigger:
    """A flag any process can raise and all processes check together (``Accelerator.set_trigger`` / ``check_trigger``).

    process: the Accelerator's process view (the flag lives on its ``device``).
    """

    def __init__(self, process: ProcessControl) -> None:
        self._process = process
        self.flag_tensor: torch.Tensor | None = None

    def set(self) -> None:
        """Raises the flag on this process; the next ``check()`` is True on every process."""
        self.flag_tensor = torch.tensor(1, device=self._process.device)

    def check(self) -> bool:
        """Whether any process raised the flag since the last check (then it is lowered). Collective."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self._process.device)
        raised = ops.reduce(self.flag_tensor, reduction="sum")
        if raised.item() >= 1:
            self.flag_tensor = torch.tensor(0, device=self._process.device)
            return True
        return False


@contextlib.contextmanager
def sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
    """The backward inside the block all-reduces a DDP model's gradients, even after forwards ran under
    ``no_sync`` (``Accelerator.trigger_sync_in_backward``); a no-op for any other model."""
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
