"""Whole-model offload for pipelines of models (diffusers, transformers' Bark): each model stays on the CPU until it
runs, then on the execution device until the next model needs the room (Accelerate's ``CpuOffload``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from accel_core.compat.memory import clear_device_cache
from accel_core.ops import send_to_device

from .model_hooks import ModelHook, add_hook_to_module, remove_hook_from_module


class UserCpuOffloadHook:
    """What ``cpu_offload_with_hook`` returns: ``offload()`` puts the model back on the CPU, ``remove()`` detaches the
    hook."""

    def __init__(self, model: nn.Module, hook: ModelHook) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        """Moves the model back to the CPU (the hook's ``init_hook``)."""
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        """Detaches the hook and restores the model's forward."""
        remove_hook_from_module(self.model)


def _default_execution_device() -> torch.device:
    from accel_core.state import PartialState

    return PartialState().default_device


class CpuOffload(ModelHook):
    """Keeps a model on the CPU until its forward runs, then moves it to ``execution_device``, where it stays
    until ``init_hook`` runs again (``UserCpuOffloadHook.offload()``, or the next model's hook in a pipeline).

    execution_device: default, the process's device (``PartialState().default_device``).
    prev_module_hook: the ``UserCpuOffloadHook`` of the previous model of a pipeline: that model goes back
        to the CPU just before this one runs.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        prev_module_hook: UserCpuOffloadHook | None = None,
    ) -> None:
        self.prev_module_hook = prev_module_hook
        self.execution_device = execution_device if execution_device is not None else _default_execution_device()

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        previous = self.prev_module_hook
        if isinstance(previous, UserCpuOffloadHook):
            previous_device = next(previous.model.parameters()).device
            if previous_device != torch.device("cpu"):
                previous.offload()
                clear_device_cache()
        if next(module.parameters()).device == torch.device(self.execution_device):
            return args, kwargs
        module.to(self.execution_device)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: int | str | torch.device | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Keeps ``model`` on the CPU and moves it to ``execution_device`` when it runs; it stays there until the
    returned hook's ``offload()`` (or the next model's forward, given this hook as its ``prev_module_hook``).

    Example::

        model_1, hook_1 = cpu_offload_with_hook(model_1, "cuda")
        model_2, hook_2 = cpu_offload_with_hook(model_2, "cuda", prev_module_hook=hook_1)
        hidden = model_1(x)    # model_1 on the GPU
        out = model_2(hidden)  # model_1 back on the CPU, model_2 on the GPU
        hook_2.offload()
    """
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)
