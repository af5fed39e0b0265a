"""The training step under the reference API's names: ``backward``, ``accumulate``, ``no_sync``, clipping, autocast
and the trigger.

``TrainingStep`` is a base class of the Accelerator (with ``ReferenceProperties``, ``ProcessControl`` and
``SetupQueries``). It holds no field of its own: it reads the fields the Accelerator's constructor sets, declared
below, and forwards to the strategy (backward, no_sync, clipping), the Precision (loss scale, unscale, autocast),
the ``GradientState`` (which micro-step synchronises) and the ``Trigger``.

Example::

    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from ..optimizer import AcceleratedOptimizer
from ..stall_report import POSITION
from ..strategies import BackwardSyncControl
from .triggers import sync_in_backward

if TYPE_CHECKING:
    from ..configuration import AutocastKwargs
    from ..precision.modes import Precision
    from ..state import AcceleratorState, GradientState
    from ..strategies import PreparedObjects, Strategy
    from .nonfinite_guard import NonFiniteGuard
    from .resumption import Resumption
    from .triggers import Trigger


class TrainingStep:
    """Base of the Accelerator: one micro-step of training, as the reference API spells it.

    Reads what the Accelerator's constructor sets: strategy, precision, gradient_state, prepared,
    step (micro-steps of the current accumulation), the nonfinite guard (None when off), the
    resumption part (periodic checkpoints at accumulation boundaries) and the trigger.
    """

    strategy: Strategy
    precision: Precision
    gradient_state: GradientState
    prepared: PreparedObjects
    step: int
    _nonfinite_guard: NonFiniteGuard | None
    _resumption: Resumption
    _trigger: Trigger

    @property
    def _current_state(self) -> AcceleratorState:
        """The process's ``AcceleratorState``, refusing once it was reset after this Accelerator was made (provided
        by the Accelerator)."""
        raise NotImplementedError

    @property
    def sync_gradients(self) -> bool:
        """Whether this step synchronises gradients (the last micro-step of an accumulation)."""
        return self.gradient_state.sync_gradients

    @property
    def gradient_accumulation_steps(self) -> int:
        """The number of micro-steps per optimizer step."""
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        # Scripts that search for a batch size that fits (find_executable_batch_size) set it afterwards.
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {value!r}.")
        self.gradient_state.num_steps = value

    @property
    def nonfinite_skips(self) -> int:
        """How many optimizer steps ``skip_nonfinite`` skipped (0 when it is off)."""
        return 0 if self._nonfinite_guard is None else self._nonfinite_guard.skips

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 inf/nan gradients): do not change the LR then."""
        return any(opt.step_was_skipped for opt in self.prepared.optimizers)

    # -- the training step ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Use instead of ``loss.backward()``: divides by the accumulation steps and applies the loss scale."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"accelerator.backward(loss) needs the loss tensor the model's output produced, got "
                f"{type(loss).__name__} {loss!r}: pass the tensor itself, before .item() or float(), e.g. "
                "`loss = loss_fn(model(inputs), targets); accelerator.backward(loss)`."
            )
        POSITION.step += 1  # the stall report's progress mark (one attribute increment)
        owns_step = self.strategy.owns_optimizer_step
        if not owns_step and self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        if self._nonfinite_guard is not None:
            self._nonfinite_guard.observe_loss(loss)
        self.strategy.backward(self.precision.scale_loss(loss), **kwargs)

    def _do_sync(self) -> None:
        if self.gradient_state.sync_with_dataloader and self.gradient_state.end_of_dataloader:
            self.step = 0
            self.gradient_state._set_sync_gradients(True)
        else:
            self.step += 1
            self.gradient_state._set_sync_gradients(self.step % self.gradient_state.num_steps == 0)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Wrap each micro-batch: gradients sync (and the optimizer steps) every ``gradient_accumulation_steps``
        micro-batches and on the last batch of the data."""
        self._resumption.accumulate_boundary()
        self._do_sync()
        with contextlib.ExitStack() as stack:
            if not (self.sync_gradients or self.gradient_state.sync_each_batch):
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skips gradient synchronisation inside the block (where the strategy can)."""
        if self._current_state.use_distributed and isinstance(self.strategy, BackwardSyncControl):
            with self.strategy.no_sync(model):
                yield
        else:
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divides gradients by the fp16 loss scale (done for you by ``clip_grad_norm_``)."""
        optimizers = (
            self.prepared.optimizers
            if optimizer is None
            else optimizer
            if isinstance(optimizer, (list, tuple))
            else [optimizer]
        )
        for opt in optimizers:
            while isinstance(opt, AcceleratedOptimizer):
                opt = opt.optimizer
            self.precision.unscale_(opt)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """Use instead of ``torch.nn.utils.clip_grad_norm_``; returns the total (global) gradient norm."""
        parameters = list(parameters)
        if self.sync_gradients:
            self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        """Use instead of ``torch.nn.utils.clip_grad_value_``."""
        parameters = list(parameters)
        if self.sync_gradients:
            self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> contextlib.AbstractContextManager[Any]:
        """Autocast for code outside the prepared model's forward (a loss computed separately, say)."""
        kwargs = autocast_handler.to_kwargs() if autocast_handler is not None else {}
        return self.precision.autocast(**kwargs)

    # -- the trigger ------------------------------------------------------------------------
    @property
    def flag_tensor(self) -> torch.Tensor | None:
        """The trigger's flag on this process (None before the first ``set_trigger`` / ``check_trigger``)."""
        return self._trigger.flag_tensor

    @flag_tensor.setter
    def flag_tensor(self, value: torch.Tensor | None) -> None:
        self._trigger.flag_tensor = value

    def set_trigger(self) -> None:
        """Raises the flag on this process; the next ``check_trigger()`` is True on every process.

        Example::

            if torch.isnan(loss):
                accelerator.set_trigger()
            if accelerator.check_trigger():  # on every process, every step
                break
        """
        self._trigger.set()

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger()`` since the last check (then the flag is lowered).

        A collective: every process must call it at the same point.
        """
        return self._trigger.check()

    @staticmethod
    def trigger_sync_in_backward(model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
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
        return sync_in_backward(model)
