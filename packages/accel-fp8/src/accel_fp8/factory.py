"""The ``accel.precisions`` entry point ``fp8``: chooses the backend and builds its Precision.

Backend: the recipe handler given (``AORecipeKwargs`` -> torchao, ``TERecipeKwargs`` -> Transformer-Engine,
deprecated ``FP8RecipeKwargs(backend=...)``), else ``ACCEL_FP8_BACKEND`` (``AO`` / ``TE``), else torchao when
installed, else Transformer-Engine. A CUDA GPU below compute capability 8.9 cannot run fp8 GEMMs: the
run falls back to fp16 with a warning, as Accelerate does.
"""

from __future__ import annotations

import logging
from functools import cache

import torch

from accel_core.configuration import AutocastKwargs
from accel_core.enums import FP8BackendType
from accel_core.install_hints import accel_extra
from accel_core.precision.fp8_recipes import (
    AORecipeKwargs,
    FP8RecipeKwargs,
    TERecipeKwargs,
    fp8_backend_of,
    fp8_recipe_handler,
)
from accel_core.precision.modes import Precision, PrecisionContext

logger = logging.getLogger("accel")

# fp8 tensor cores: Ada Lovelace (8.9) and Hopper (9.0) onwards.
MIN_FP8_CAPABILITY = (8, 9)


def fp8_fallback(device_type: str, capability: tuple[int, int] | None) -> str | None:
    """The precision to use instead of fp8 on this device (None: fp8 runs here).

    A CUDA device below compute capability 8.9 gets ``"fp16"`` (Accelerate's choice); the CPU and newer GPUs
    run fp8 (torchao's float8 linear has a CPU kernel).

    Example: ``fp8_fallback("cuda", (8, 0)) == "fp16"``; ``fp8_fallback("cuda", (9, 0)) is None``.
    """
    if device_type == "cuda" and capability is not None and tuple(capability) < MIN_FP8_CAPABILITY:
        return "fp16"
    return None


@cache
def check_cuda_fp8_capability() -> bool:
    """Whether the current CUDA GPU has fp8 tensor cores (compute capability >= 8.9). Initialises CUDA."""
    return torch.cuda.is_available() and fp8_fallback("cuda", torch.cuda.get_device_capability()) is None


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA compute capability of ``device`` (None for other devices)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major, minor


def make_precision(context: PrecisionContext) -> Precision:
    """The fp8 Precision for ``context`` (the ``PrecisionFactory`` accel-core calls for ``mixed_precision="fp8"``)."""
    device = context.device
    capability = device_capability(device)
    fallback = fp8_fallback(device.type, capability)
    if fallback is not None:
        if context.fallback is None:
            raise ValueError(
                f"fp8 needs a GPU of compute capability >= 8.9, this one has {capability}: use bf16 or fp16."
            )
        if context.is_main_process:
            logger.warning(
                "The current device has compute capability of %s which is insufficient for FP8 mixed precision "
                "training (requires a GPU Hopper/Ada Lovelace or higher, compute capability of 8.9 or higher). "
                "Will use %s instead.",
                capability,
                fallback.upper(),
            )
        return context.fallback(fallback)
    handler = fp8_recipe_handler(context.handlers)
    if isinstance(handler, (AORecipeKwargs, TERecipeKwargs)):
        # The fields the script left unset take the run's ACCEL_FP8_* (its settled record), FP8RecipeKwargs's backend
        # among them: before the backend is chosen from it.
        handler.apply_environment(context.environ)
    backend = fp8_backend_of(context.handlers, context.environ)
    autocast = context.handlers.get(AutocastKwargs)
    autocast_kwargs = autocast.to_kwargs() if autocast is not None else {}
    if backend == FP8BackendType.AO:
        from .ao import AOFloat8Precision

        if not isinstance(handler, AORecipeKwargs):  # none given (or FP8RecipeKwargs(backend="AO")): the defaults
            handler = AORecipeKwargs()
            handler.apply_environment(context.environ)
        return AOFloat8Precision(device.type, handler, context.is_main_process, autocast_kwargs)
    if backend == FP8BackendType.TE:
        from .te import TEFloat8Precision

        te_handler = handler if isinstance(handler, (TERecipeKwargs, FP8RecipeKwargs)) else None
        return TEFloat8Precision(device.type, te_handler, context.is_main_process, autocast_kwargs, context.environ)
    raise ImportError(
        f'mixed_precision="fp8" needs torchao or Transformer-Engine: {accel_extra("fp8")} (torchao, CPU and GPU), '
        'or pip install "accel-fp8[te]" on a CUDA machine.'
    )
