"""Mixed precision: one small class per mode, asked by the Accelerator and the model transforms.

A Precision answers: how to convert a module before it is split (``convert_module``, the hook
fp8 fills), how to build one (``module_init_context``: meta device, low-precision weights), the
policy FSDP2 gathers and reduces with (``mixed_precision_policy``), autocast around the forward,
loss scaling and the optimizer step.

``no``: full precision. ``bf16``: autocast to bfloat16 (CPU too), no scaler. ``fp16``: autocast to
float16 with a ``torch.amp.GradScaler`` (on CPU too: slower than bf16 there, but it lets the scaler
path run on any machine). ``fp8`` lives in a backend package (accel-fp8: torchao, Transformer-Engine),
registered in the ``accel.precisions`` entry point group as a ``PrecisionFactory``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..ops import convert_to_fp32


class Precision:
    """Full precision, or precision the strategy applies itself: every hook is a pass-through.

    name: the mode reported as ``accelerator.mixed_precision`` ("no", or what a strategy that owns
        precision, such as DeepSpeed, computes in).
    """

    scaler: Any = None

    param_dtype: torch.dtype | None = None  # the dtype parameters are computed in (None: as they are)

    def __init__(self, name: str = "no") -> None:
        self.name = name

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """First model transform, before tensor parallelism or sharding: swaps layers for the precision's
        own (fp8 linear layers); returns the module. Nothing to convert here."""
        return module

    def parallel_style(self, style: Any, modules: list[torch.nn.Module]) -> Any:
        """The tensor-parallel style to split ``modules`` (converted by ``convert_module``) with: a precision
        whose layers have their own styles (torchao's float8 ones) swaps ``style`` for it. Unchanged here."""
        return style

    def module_init_context(self, empty_init: bool = False) -> contextlib.AbstractContextManager[Any]:
        """Where and how to build a model: ``empty_init=True`` builds it on the meta device (no memory; the
        transforms give each process memory for its part, then initialise it).

        Example::

            with accelerator.precision.module_init_context(empty_init=True):
                model = BigModel()
        """
        return torch.device("meta") if empty_init else contextlib.nullcontext()

    def mixed_precision_policy(self) -> Any:
        """The ``MixedPrecisionPolicy`` FSDP2 gathers parameters and reduces gradients with."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.param_dtype is None:
            return MixedPrecisionPolicy()
        # Compute in low precision, reduce in fp32: the sharded fp32 parameters are the master
        # weights, and summing gradients in bf16 loses bits that fp32 keeps.
        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Makes ``model.forward`` run under autocast and return fp32 outputs (no-op here)."""

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divides the gradients by the loss scale, once per step (no-op without a scaler)."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Steps ``optimizer``; returns True when the step was skipped (inf/nan gradients)."""
        optimizer.step(**kwargs)
        return False

    def skip_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Leaves ``optimizer`` unstepped this iteration (the non-finite guard said so); nothing to reset here."""


@dataclass
class PrecisionContext:
    """What a precision plugin is given to build itself: a narrow view of the job, not the Accelerator.

    device: this process's device. handlers: the kwargs handlers by type (the fp8 recipe handlers).
    is_main_process: whether this process logs (conversion reports). fallback: builds one of core's
    precisions by name ("bf16", "fp16"), for a device that cannot run the requested one (a GPU below
    compute capability 8.9 asked for fp8). environ: the run's settled variables (``RunSettings.environ``), where a
    precision reads its own (fp8's ``ACCEL_FP8_*``); never ``os.environ``.
    """

    device: torch.device
    handlers: Mapping[type, Any] = field(default_factory=dict)
    is_main_process: bool = True
    fallback: Callable[[str], Precision] | None = None
    environ: Mapping[str, str] = field(default_factory=dict)


class PrecisionFactory(Protocol):
    """What the ``accel.precisions`` entry point names: a callable building the Precision of its mode."""

    def __call__(self, context: PrecisionContext) -> Precision: ...


class AutocastPrecision(Precision):
    """bf16 or fp16 autocast around the forward; fp16 adds dynamic loss scaling. Any other name (fp8's
    precisions subclass it) computes in bfloat16 outside the converted layers."""

    def __init__(self, name: str, device_type: str, scaler: Any = None, autocast_kwargs: dict[str, Any] | None = None):
        self.name = name
        self.dtype = torch.float16 if name == "fp16" else torch.bfloat16
        self.param_dtype = self.dtype
        self.device_type = device_type
        self.scaler = scaler
        self.autocast_kwargs = autocast_kwargs or {}
        self._unscaled: set[int] = set()

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        kwargs = {**self.autocast_kwargs, "enabled": enabled}
        if cache_enabled is not None:
            kwargs["cache_enabled"] = cache_enabled
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, **kwargs)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        if isinstance(model.__dict__.get("forward"), AutocastForward):
            return
        model.forward = AutocastForward(model, model.forward, self.device_type, self.dtype, self.autocast_kwargs)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        if self.scaler is None:
            optimizer.step(**kwargs)
            return False
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        # GradScaler lowers the scale exactly when it skipped the step for inf/nan gradients.
        return self.scaler.get_scale() < scale_before

    def skip_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            return
        # Ends the scaler's iteration without a step: update() with the current scale forgets this
        # iteration's unscale_ (a later one would otherwise refuse to run) and keeps the scale, as
        # the skip is the loss's doing, not an fp16 overflow of the gradients.
        self.scaler.update(new_scale=self.scaler.get_scale())
        self._unscaled.discard(id(optimizer))


class AutocastForward:
    """``model.forward`` run under autocast with fp32 outputs; an object, so that a prepared model (and an
    Accelerator holding one) pickles and deep-copies.

    The class's own ``forward`` is looked up when called rather than held as a bound method, which
    would pickle as a lookup of ``model.forward``: this object.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        original: Callable[..., Any],
        device_type: str,
        dtype: torch.dtype,
        kwargs: dict[str, Any],
    ) -> None:
        own = getattr(original, "__self__", None) is module and getattr(original, "__func__", None) is getattr(
            type(module), "forward", None
        )
        self.module = module
        self.original: Callable[..., Any] | None = None if own else original
        self.device_type, self.dtype, self.kwargs = device_type, dtype, dict(kwargs)

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        # What inspect.signature reports (transformers reads forward's parameters).
        return self.original if self.original is not None else type(self.module).forward.__get__(self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype, **self.kwargs):
            outputs = self.__wrapped__(*args, **kwargs)
        return convert_to_fp32(outputs)


def unwrap_forward(model: torch.nn.Module) -> None:
    """Removes the autocast wrapper that ``wrap_forward`` put on ``model.forward``."""
    forward = model.__dict__.get("forward")
    if not isinstance(forward, AutocastForward):
        return
    if forward.original is None:
        del model.__dict__["forward"]  # back to the class's bound method
    else:
        model.forward = forward.original
