"""``MegatronLMDummyScheduler``: the placeholder Accelerate scripts pass to ``prepare`` for Megatron's LR schedule.

``prepare`` replaces it with ``MegatronLRScheduler``, a torch ``LRScheduler`` whose learning rates
are Megatron-core's ``OptimizerParamScheduler`` formula: linear warm-up from 0 over
``warmup_num_steps``, then the plugin's ``lr_decay_style`` (linear, cosine, constant,
inverse-square-root) down to its ``min_lr`` at ``total_num_steps``. Each parameter group's
starting ``lr`` is its peak. The prepared scheduler steps like any other (``scheduler_stepping``),
so the step counts are written as for a torch scheduler: by default per process, as Accelerate's
Megatron integration divides them by the data-parallel size.

Example::

    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=1000, warmup_num_steps=100)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
"""

from __future__ import annotations

import types
import warnings
from typing import TYPE_CHECKING, Any

from torch.optim.lr_scheduler import LRScheduler

if TYPE_CHECKING:
    import torch

DECAY_STYLES = ("linear", "cosine", "constant", "inverse-square-root")


class MegatronLMDummyScheduler:
    """Stands for Megatron's LR schedule until ``prepare`` (Accelerate's signature).

    total_num_steps: scheduler steps until the learning rate reaches ``min_lr`` (required).
    warmup_num_steps: scheduler steps of linear warm-up from 0.
    """

    def __init__(
        self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0, **kwargs: Any
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Raises: the placeholder is replaced by a real scheduler in ``accelerator.prepare``."""
        raise RuntimeError(
            "MegatronLMDummyScheduler is a placeholder: pass it to accelerator.prepare() and use what it returns."
        )

    def __repr__(self) -> str:
        return (
            f"MegatronLMDummyScheduler(total_num_steps={self.total_num_steps}, "
            f"warmup_num_steps={self.warmup_num_steps})"
        )


class MegatronLRScheduler(LRScheduler):
    """Megatron-core's warm-up + decay schedule as a torch ``LRScheduler`` (state dict, ``get_last_lr``, ...)."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int,
        warmup_num_steps: int = 0,
        decay_style: str = "linear",
        min_lr: float = 0.0,
    ) -> None:
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        if decay_style not in DECAY_STYLES:
            raise ValueError(f"lr_decay_style={decay_style!r} is not one of {', '.join(DECAY_STYLES)}.")
        if not isinstance(total_num_steps, int) or total_num_steps < 1:
            raise ValueError(
                f"MegatronLMDummyScheduler(total_num_steps={total_num_steps!r}): give the number of scheduler steps, "
                "an integer >= 1."
            )
        if not 0 <= warmup_num_steps < total_num_steps:
            raise ValueError(
                f"warmup_num_steps={warmup_num_steps} must be >= 0 and below total_num_steps={total_num_steps}."
            )
        peak = max(group["lr"] for group in optimizer.param_groups)
        if min_lr > min(group["lr"] for group in optimizer.param_groups):
            raise ValueError(f"min_lr={min_lr} is above a parameter group's learning rate: lower the plugin's min_lr.")
        # Megatron's class computes the formula; given no parameter groups of its own, it changes
        # nothing itself (it would also overwrite every group's weight decay).
        self._formula = OptimizerParamScheduler(
            types.SimpleNamespace(param_groups=[]),  # pyright: ignore[reportArgumentType]  # no groups, see above
            init_lr=0.0,
            max_lr=peak,
            min_lr=min_lr,
            lr_warmup_steps=warmup_num_steps,
            lr_decay_steps=total_num_steps,
            lr_decay_style=decay_style,
            start_wd=0.0,
            end_wd=0.0,
            wd_incr_steps=1,
            wd_incr_style="constant",
        )
        super().__init__(optimizer)

    def get_lr(self) -> list[float | torch.Tensor]:  # LRScheduler's type; the values are floats
        self._formula.num_steps = self.last_epoch
        return [self._formula.get_lr({"max_lr": base_lr}) for base_lr in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_formula")}


def build_scheduler(dummy: MegatronLMDummyScheduler, decay_style: str, min_lr: float) -> MegatronLRScheduler:
    """The real scheduler ``prepare`` puts in place of ``dummy``."""
    if dummy.total_num_steps is None:
        raise ValueError(
            "MegatronLMDummyScheduler needs total_num_steps (the scheduler steps of the whole training): "
            "MegatronLMDummyScheduler(optimizer, total_num_steps=..., warmup_num_steps=...)."
        )
    if dummy.kwargs:
        warnings.warn(
            f"MegatronLMDummyScheduler ignores {sorted(dummy.kwargs)}: the schedule's shape comes from the "
            "MegatronLMPlugin's lr_decay_style and min_lr.",
            stacklevel=3,
        )
    return MegatronLRScheduler(dummy.optimizer, dummy.total_num_steps, dummy.warmup_num_steps, decay_style, min_lr)
