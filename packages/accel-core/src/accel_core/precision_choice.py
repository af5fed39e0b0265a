"""Which Precision object a strategy trains with: the one decision between the Accelerator's
``mixed_precision`` argument and the classes of ``accel_core.precision``.

fp8 comes from the ``accel.precisions`` entry point (accel-fp8) unless the strategy applies
precision itself (DeepSpeed, Megatron: ``owns_precision``), in which case every mode is a
pass-through ``Precision`` named after what the backend computes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from . import plugins
from .configuration import AutocastKwargs, GradScalerKwargs
from .precision import AutocastPrecision, Precision, PrecisionContext, PrecisionFactory
from .strategies import Strategy


def choose_precision(
    name: str, strategy: Strategy, device: torch.device, handlers: Mapping[type, Any], is_main_process: bool
) -> Precision:
    """The Precision for mode ``name`` ("no", "fp16", "bf16", "fp8") under ``strategy`` on ``device``.

    Raises ValueError naming the modes the strategy supports, or the fix for a device that cannot
    run the mode (bf16 on a pre-Ampere GPU).
    """
    if name not in strategy.supported_precisions:
        raise ValueError(
            f"mixed_precision={name!r} is not supported by the {strategy.name} strategy; "
            f"use one of {list(strategy.supported_precisions)}."
        )
    if name == "fp8" and not strategy.owns_precision:
        context = PrecisionContext(
            device=device,
            handlers=handlers,
            is_main_process=is_main_process,
            # fp8 on a device that cannot run it falls back to what the recipe names (bf16, no).
            fallback=partial(
                choose_precision, strategy=strategy, device=device, handlers=handlers, is_main_process=is_main_process
            ),
        )
        factory: PrecisionFactory = plugins.load("accel.precisions", "fp8")
        return factory(context)
    if strategy.owns_precision:
        # The backend applies it (and settled it from its own config: resolve_precision).
        return Precision(name)
    if name == "no":
        return Precision()
    if name == "bf16" and device.type == "cuda" and not cuda_computes_bf16():
        raise ValueError(
            "bf16 mixed precision needs a GPU that computes in bfloat16 (Ampere or newer); this one only emulates it, "
            "far slower than fp16: use mixed_precision='fp16'."
        )
    scaler = None
    if name == "fp16":
        scaler_kwargs = handlers[GradScalerKwargs].to_kwargs() if GradScalerKwargs in handlers else {}
        scaler = strategy.make_grad_scaler(device, **scaler_kwargs)
    autocast_kwargs = handlers[AutocastKwargs].to_kwargs() if AutocastKwargs in handlers else {}
    return AutocastPrecision(name, device.type, scaler=scaler, autocast_kwargs=autocast_kwargs)


def cuda_computes_bf16() -> bool:
    """Whether the current GPU computes in bfloat16 natively (compute capability 8.0 and up).

    ``torch.cuda.is_bf16_supported()`` also counts emulation by default, which says yes on a V100 or a T4.
    """
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch without the argument (before 2.4) does not count emulation
        return bool(torch.cuda.is_bf16_supported())
