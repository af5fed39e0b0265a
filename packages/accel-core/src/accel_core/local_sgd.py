"""Local SGD: each process trains on its own for a few steps, then all average their parameters.

Gradients are not all-reduced inside the block (the model runs under ``no_sync``); every
``local_sgd_steps`` calls of ``step()``, and when the block ends, each parameter is replaced by its
mean over the processes. That trades some statistical efficiency for far less communication.

Example::

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .enums import DistributedType

if TYPE_CHECKING:
    import torch

    from .accelerator.accelerator import Accelerator

# Plain data parallelism only: sharded or model-parallel strategies have no whole parameters to average.
_SUPPORTED = {
    DistributedType.NO,
    DistributedType.MULTI_CPU,
    DistributedType.MULTI_GPU,
    DistributedType.MULTI_XPU,
    DistributedType.MULTI_MLU,
    DistributedType.MULTI_HPU,
    DistributedType.MULTI_SDAA,
    DistributedType.MULTI_MUSA,
    DistributedType.MULTI_NPU,
    DistributedType.MULTI_NEURON,
}


class LocalSGD:
    """Averages ``model``'s parameters across processes every ``local_sgd_steps`` calls of ``step()``.

    Use it as a context manager around the training loop. It does nothing on one process, or with
    ``enabled=False``. Raises NotImplementedError under FSDP, DeepSpeed or Megatron.
    """

    def __init__(
        self, accelerator: Accelerator, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True
    ) -> None:
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotImplementedError("LocalSGD is supported only for CPUs and GPUs (no DeepSpeed or MegatronLM)")
        if enabled and (not isinstance(local_sgd_steps, int) or local_sgd_steps < 1):
            raise ValueError(f"local_sgd_steps must be a positive integer, got {local_sgd_steps!r}.")
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: contextlib.AbstractContextManager[Any] | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.enabled and self._no_sync is not None:
            if exc_type is None:  # after an error the other processes may never arrive: do not wait for them
                self._sync_and_avg_model_params()
            self._no_sync.__exit__(exc_type, exc, traceback)
            self._no_sync = None

    def step(self) -> None:
        """Counts one step; every ``local_sgd_steps``-th call averages the parameters (all processes must call it)."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")
