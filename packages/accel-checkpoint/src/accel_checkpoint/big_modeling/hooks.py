"""Forward hooks that run a dispatched model: move inputs to each part's device, load offloaded weights just in time.

An offloaded tensor lives on the meta device between calls. Right before the module that owns it
runs, a pre-hook reads it from the weights map (CPU memory or an offload file) onto the execution
device; right after, a hook puts it back on meta, freeing the memory. Only the tensors a hook
loaded are put back, so a tied parameter that lives on a device stays there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from accel_core.ops import send_to_device
from accel_core.structures import find_device

from .offload import set_module_tensor_to_device

_HANDLES = "_accel_dispatch_handles"


def _keep(module: nn.Module, handle: Any) -> None:
    if _HANDLES not in module.__dict__:
        module.__dict__[_HANDLES] = []
    module.__dict__[_HANDLES].append(handle)


def attach_io_hook(module: nn.Module, device: Any, skip_keys: str | list[str] | None = None, io_same_device: bool = False) -> None:
    """Before ``module`` runs, its inputs go to ``device``; with ``io_same_device`` its outputs come back to the inputs' device."""
    input_devices: list[Any] = []

    def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        if io_same_device:
            input_devices.append(find_device([args, kwargs]))
        return send_to_device(args, device), send_to_device(kwargs, device, skip_keys=skip_keys)

    _keep(module, module.register_forward_pre_hook(pre, with_kwargs=True))
    if io_same_device:

        def post(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
            origin = input_devices.pop() if input_devices else None
            return output if origin is None else send_to_device(output, origin, skip_keys=skip_keys)

        _keep(module, module.register_forward_hook(post, with_kwargs=True))


def attach_offload_hook(
    module: nn.Module, names: list[str], weights: Mapping[str, torch.Tensor], prefix: str, device: Any
) -> None:
    """Loads ``module``'s tensors ``names`` (relative, dotted) from ``weights[prefix + name]`` onto ``device`` for each call."""
    loaded: list[str] = []

    def pre(mod: nn.Module, args: tuple[Any, ...]) -> None:
        for name in names:
            owner, _, attribute = name.rpartition(".")
            if getattr(mod.get_submodule(owner), attribute).device.type == "meta":
                set_module_tensor_to_device(mod, name, device, value=weights[prefix + name])
                loaded.append(name)

    def post(mod: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        while loaded:
            set_module_tensor_to_device(mod, loaded.pop(), "meta")
        return output

    _keep(module, module.register_forward_pre_hook(pre))
    _keep(module, module.register_forward_hook(post))


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Removes the hooks ``dispatch_model`` / ``cpu_offload`` / ``disk_offload`` attached (offloaded tensors stay on meta)."""
    for sub in module.modules():
        for handle in sub.__dict__.pop(_HANDLES, []):
            handle.remove()
    module.__dict__.pop("to", None)
    module.__dict__.pop("cuda", None)


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether some tensor of ``module`` is loaded just in time by a dispatch hook (and is on meta between calls)."""
    return _HANDLES in module.__dict__ and any(t.device.type == "meta" for t in module.parameters())


def guard_moves(model: nn.Module) -> None:
    """``model.to(...)`` / ``.cuda()`` on a dispatched model with offloaded tensors raises instead of half-moving it."""
    for method in ("to", "cuda"):
        original = getattr(model, method)

        def guarded(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if any(p.device.type == "meta" for p in model.parameters()):
                raise RuntimeError("You can't move a model that has some modules offloaded to cpu or disk.")
            return _original(*args, **kwargs)

        model.__dict__[method] = guarded
