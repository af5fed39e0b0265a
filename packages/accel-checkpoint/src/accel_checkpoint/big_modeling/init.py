"""Create a model without allocating its weights (on the meta device), or directly on a chosen device."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from accel_core.environment import parse_flag


def _include_buffers_default() -> bool:
    # accel's name wins over the reference's when both are set.
    value = next(
        (os.environ[n] for n in ("ACCEL_INIT_INCLUDE_BUFFERS", "ACCELERATE_INIT_INCLUDE_BUFFERS") if n in os.environ),
        None,
    )
    return parse_flag(value, False)


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Models created in the block have their parameters on the meta device: no memory, no initialisation.

    include_buffers: put buffers on meta too (default: ``ACCEL_INIT_INCLUDE_BUFFERS`` or
    ``ACCELERATE_INIT_INCLUDE_BUFFERS``, else False). Load real weights with
    ``load_checkpoint_and_dispatch``; such a model cannot ``.to(device)``.

    Example::

        with init_empty_weights():
            model = nn.Sequential(*[nn.Linear(10000, 10000) for _ in range(1000)])   # instant, 0 bytes
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool | None = None) -> Iterator[None]:
    """Parameters of modules created in the block are put on ``device`` as they are registered.

    include_buffers: buffers (and every tensor created in the block) go there too.

    Example::

        with init_on_device("cuda"):
            layer = nn.Linear(100, 100)   # its weight is created on the GPU
    """
    if include_buffers is None:
        include_buffers = _include_buffers_default()
    if include_buffers:
        with torch.device(device):
            yield
        return
    original = nn.Module.register_parameter

    def register_on_device(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None:
            current = module._parameters[name]
            assert current is not None
            attributes: dict[str, Any] = dict(current.__dict__)
            # The Parameter subclass (and transformers' _is_hf_initialized mark) survive the move.
            hf_initialized = attributes.pop("_is_hf_initialized", None)
            attributes["requires_grad"] = param.requires_grad
            moved = type(current)(current.to(device), **attributes)
            if hf_initialized is not None:
                moved._is_hf_initialized = hf_initialized  # pyright: ignore[reportAttributeAccessIssue]
            module._parameters[name] = moved

    # Patched for the duration of the block only, as the reference's init_on_device does.
    nn.Module.register_parameter = register_on_device  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield
    finally:
        nn.Module.register_parameter = original
