"""The general case of ``Strategy.make_precision``: which Precision a strategy that leaves precision to
core trains with, for the Accelerator's ``mixed_precision`` ("no", "fp16", "bf16", "fp8").

fp8 comes from the ``accel.precisions`` entry point (accel-fp8); bf16 and fp16 are autocast, fp16
with a GradScaler (the strategy may pass its own kind, FSDP a sharded one). A strategy that applies
precision itself (DeepSpeed) does not call this: it returns its own Precision subclass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from .. import discovery
from ..configuration import AutocastKwargs, GradScalerKwargs
from .fp8_recipes import RECIPE_HANDLERS, fp8_recipe_handler
from .modes import AutocastPrecision, Precision, PrecisionContext, PrecisionFactory

logger = logging.getLogger("accel")

GradScalerFactory = Callable[..., Any]
"""``(device_type, **GradScalerKwargs) -> scaler``: ``torch.amp.GradScaler`` unless a strategy passes another."""


def default_precision(
    name: str, context: PrecisionContext, grad_scaler: GradScalerFactory = torch.amp.GradScaler
) -> Precision:
    """The Precision for mode ``name`` on ``context.device``, as core builds it.

    Raises ValueError for an fp8 recipe handler without ``mixed_precision="fp8"``, and for a device
    that cannot run the mode (bf16 on a pre-Ampere GPU).
    """
    handlers = context.handlers
    if name != "fp8" and fp8_recipe_handler(handlers) is not None:
        raise ValueError("Passing in an FP8 configuration requires setting `mixed_precision='fp8'`.")
    if name == "fp8":
        # fp8 on a device that cannot run it falls back to what the recipe names (bf16, no), built here.
        fallback = partial(_without_fp8, context=context, grad_scaler=grad_scaler)
        fp8_context = PrecisionContext(context.device, handlers, context.is_main_process, fallback, context.environ)
        factory: PrecisionFactory = discovery.load("accel.precisions", "fp8")
        return factory(fp8_context)
    if name == "no":
        return Precision()
    if name == "bf16" and context.device.type == "cuda" and not cuda_computes_bf16():
        raise ValueError(
            "bf16 mixed precision needs a GPU that computes in bfloat16 (Ampere or newer); this one only emulates it, "
            "far slower than fp16: use mixed_precision='fp16'."
        )
    scaler = None
    if name == "fp16" and context.device.type == "cpu" and context.is_main_process:
        # Allowed (the scaler path runs on any machine), but rarely what a user wants: say so once, and the fix.
        logger.warning(
            "fp16 on the CPU: torch's float16 CPU kernels are far slower than float32 (a small conv net here: 446 ms "
            "a step against 6.7 ms in float32 and 4.5 ms in bf16, torch 2.15). bf16 is the CPU's mixed precision: "
            "--mixed-precision bf16 / Accelerator(mixed_precision='bf16'). Training goes on in fp16."
        )
    if name == "fp16":
        scaler_kwargs = handlers[GradScalerKwargs].to_kwargs() if GradScalerKwargs in handlers else {}
        scaler = grad_scaler(context.device.type, **scaler_kwargs)
    autocast_kwargs = handlers[AutocastKwargs].to_kwargs() if AutocastKwargs in handlers else {}
    return AutocastPrecision(name, context.device.type, scaler=scaler, autocast_kwargs=autocast_kwargs)


def _without_fp8(name: str, context: PrecisionContext, grad_scaler: GradScalerFactory) -> Precision:
    # The recipe handler that asked for fp8 is still in the handlers: the fallback must not refuse it.
    handlers = {kind: handler for kind, handler in context.handlers.items() if kind not in RECIPE_HANDLERS}
    fallback_context = PrecisionContext(context.device, handlers, context.is_main_process, environ=context.environ)
    return default_precision(name, fallback_context, grad_scaler)


def cuda_computes_bf16() -> bool:
    """Whether the current GPU computes in bfloat16 natively (compute capability 8.0 and up).

    ``torch.cuda.is_bf16_supported()`` also counts emulation by default, which says yes on a V100 or a T4.
    """
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch without the argument (before 2.4) does not count emulation
        return bool(torch.cuda.is_bf16_supported())
