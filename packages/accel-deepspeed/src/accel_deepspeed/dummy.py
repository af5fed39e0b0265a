"""Placeholders for an optimizer and a scheduler that the DeepSpeed config defines.

When the config has an ``"optimizer"`` (or ``"scheduler"``) section, DeepSpeed builds it; the
training script passes these placeholders to ``prepare`` instead, and gets DeepSpeed's objects
back. Their arguments fill the config's ``"auto"`` values.

Example::

    optimizer = DummyOptim(model.parameters(), lr=3e-4)           # config: "optimizer": {"type": "AdamW", ...}
    scheduler = DummyScheduler(optimizer, total_num_steps=1000, warmup_num_steps=100)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NoReturn

import torch
from torch.optim.lr_scheduler import LRScheduler


class DummyOptim(torch.optim.Optimizer):
    """Stands for the optimizer of the DeepSpeed config; ``lr`` and ``weight_decay`` fill its "auto" params.

    It subclasses ``torch.optim.Optimizer`` only so ``prepare`` accepts it; it holds no state and
    cannot step (``prepare`` replaces it).
    """

    # Deliberately no super().__init__: nothing is optimized here.
    def __init__(self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0.0, **kwargs: Any) -> None:
        self.params = list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs
        self.defaults = {"lr": lr, "weight_decay": weight_decay, **kwargs}
        self.state = {}  # pyright: ignore[reportAttributeAccessIssue]  # a placeholder: no per-parameter state
        groups = self.params if self.params and isinstance(self.params[0], dict) else [{"params": self.params}]
        self.param_groups = [{**self.defaults, **group} for group in groups]

    def step(self, closure: Any = None) -> NoReturn:
        """Always raises ``RuntimeError``: a placeholder cannot step; use what ``prepare`` returns."""
        raise RuntimeError(
            "DummyOptim is a placeholder: pass it to accelerator.prepare() with its model and use what it returns."
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Always raises ``RuntimeError``: a placeholder holds no gradients; use what ``prepare`` returns."""
        raise RuntimeError(
            "DummyOptim is a placeholder: pass it to accelerator.prepare() with its model and use what it returns."
        )

    def __repr__(self) -> str:
        return f"DummyOptim(lr={self.lr}, weight_decay={self.weight_decay})"


class DummyScheduler(LRScheduler):
    """Stands for the scheduler of the DeepSpeed config (or one built by ``lr_scheduler_callable``).

    total_num_steps / warmup_num_steps: fill the config's "auto" scheduler params. As in Accelerate,
        ``total_num_steps`` is divided by the number of processes (not with ``split_batches``, nor with
        ``scheduler_stepping="per_optimizer_step"``); ``warmup_num_steps`` is taken as it is.
    lr_scheduler_callable: ``fn(optimizer) -> scheduler``, called by DeepSpeed with its optimizer,
        when the config has no scheduler.
    """

    # Deliberately no super().__init__: it must not patch the placeholder optimizer.
    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs

    def step(self, epoch: Any = None) -> None:
        """Always raises ``RuntimeError``: a placeholder cannot step; use what ``prepare`` returns."""
        raise RuntimeError("DummyScheduler is a placeholder: pass it to accelerator.prepare() and use what it returns.")

    def __repr__(self) -> str:
        return f"DummyScheduler(total_num_steps={self.total_num_steps}, warmup_num_steps={self.warmup_num_steps})"
