"""Materialising a model built on the meta device, without leaving uninitialised memory behind.

After ``to_empty`` every parameter holds whatever the allocator returned; only an initialiser
makes it a value. Who initialises, first found wins: the caller's ``init_fn(module)`` (FSDP's
``param_init_fn``), the model's own ``init_weights()`` (torchtitan's convention: it sets every
parameter and buffer), else each module's ``reset_parameters()``. A module holding tensors that
none of these covers is refused before any memory is allocated, with its name. ``materialize`` does the
three (check, allocate, initialise) as one step, for every strategy that starts a model from the meta device
(``Strategy.place_model``; accel-fsdp's FSDP2 after ``fully_shard``, so each process allocates its shards only).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def has_meta_tensors(model: nn.Module) -> bool:
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def _class_name(module: nn.Module) -> str:
    """The module's class as the script wrote it, past the subclasses torch.distributed makes of it on the fly
    (``fully_shard`` turns ``Block`` into ``FSDPBlock``)."""
    return next(c for c in type(module).__mro__ if not c.__module__.startswith("torch.distributed")).__name__


def uninitialisable(model: nn.Module) -> list[str]:
    """Names of submodules with meta-device tensors of their own and no ``reset_parameters``."""
    missing = []
    for name, module in model.named_modules():
        own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        if any(t.is_meta for t in own) and not callable(getattr(module, "reset_parameters", None)):
            missing.append(f"{name or '<root>'} ({_class_name(module)})")
    return missing


def check_initialisable(model: nn.Module, init_fn: Callable[[nn.Module], None] | None = None) -> None:
    """Raises ValueError naming the modules a meta-device model could not initialise (before any allocation)."""
    if init_fn is not None or callable(getattr(model, "init_weights", None)):
        return
    missing = uninitialisable(model)
    if missing:
        raise ValueError(
            f"{_class_name(model)} was built on the meta device, but these modules hold tensors and have no "
            f"reset_parameters() to give them values: {', '.join(missing)}. Add reset_parameters() to them, give the "
            "model an init_weights() method that sets every parameter and buffer, or build it on a real device."
        )


def initialise(model: nn.Module, init_fn: Callable[[nn.Module], None] | None = None) -> None:
    """Fills a freshly allocated (``to_empty``) model; see the module docstring for the order."""
    init_weights = getattr(model, "init_weights", None)
    with torch.no_grad():
        if init_fn is not None:
            for module in model.modules():
                init_fn(module)
        elif callable(init_weights):
            init_weights()
        else:
            for module in model.modules():
                reset_parameters = getattr(module, "reset_parameters", None)
                if callable(reset_parameters):
                    reset_parameters()


def materialize(model: nn.Module, device: torch.device, init_fn: Callable[[nn.Module], None] | None = None) -> None:
    """Allocates a meta-device model on ``device`` and initialises it, refusing first (with the modules' names, before
    any allocation) what it cannot initialise. Not collective: processes holding the same model fail alike.

    Every buffer ends on ``device``: an ``init_weights`` that assigns a new tensor to a buffer (a rotary table computed
    on the CPU) would otherwise leave it elsewhere, to meet the activations of the forward on another device.
    """
    check_initialisable(model, init_fn)
    model.to_empty(device=device)
    initialise(model, init_fn)
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)
