"""Forward hooks that run a dispatched model: move inputs to each part's device, load offloaded weights just in time.

An offloaded tensor lives on the meta device between calls. Right before the module that owns it
runs, a pre-hook reads it from the weights map (CPU memory or an offload file) onto the execution
device; right after, a hook puts it back on meta, freeing the memory. Only the tensors a hook
loaded are put back, so a tied parameter that lives on a device stays there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from accel_core.ops import send_to_device
from accel_core.structures import find_device

from .model_hooks import remove_hook_from_module
from .offload import set_module_tensor_to_device

_HANDLES = "_accel_dispatch_handles"
_OFFLOAD = "_accel_offload_hook"  # (load, unload) of a module whose tensors are loaded just in time


def _keep(module: nn.Module, handle: Any) -> None:
    if _HANDLES not in module.__dict__:
        module.__dict__[_HANDLES] = []
    module.__dict__[_HANDLES].append(handle)


def attach_io_hook(
    module: nn.Module, device: Any, skip_keys: str | list[str] | None = None, io_same_device: bool = False
) -> None:
    """Before ``module`` runs, its inputs go to ``device``; with ``io_same_device`` its outputs come back to the inputs'
    device."""
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
    """Loads ``module``'s tensors ``names`` (relative, dotted) from ``weights[prefix + name]`` onto ``device`` for each
    call."""
    loaded: list[str] = []

    def load(mod: nn.Module, target: Any = None) -> None:
        target = device if target is None else target
        for name in names:
            owner, _, attribute = name.rpartition(".")
            if getattr(mod.get_submodule(owner), attribute).device.type == "meta":
                set_module_tensor_to_device(mod, name, target, value=weights[prefix + name])
                loaded.append(name)

    def unload(mod: nn.Module) -> None:
        while loaded:
            set_module_tensor_to_device(mod, loaded.pop(), "meta")

    def post(mod: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        unload(mod)
        return output

    _keep(module, module.register_forward_pre_hook(lambda mod, args: load(mod)))
    _keep(module, module.register_forward_hook(post))
    module.__dict__[_OFFLOAD] = (load, unload)


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Removes the hooks ``dispatch_model`` / ``cpu_offload`` / ``disk_offload`` attached (offloaded tensors stay on
    meta), and every ``ModelHook`` ``add_hook_to_module`` attached (their ``detach_hook`` runs, forwards are
    restored)."""
    for sub in module.modules():
        for handle in sub.__dict__.pop(_HANDLES, []):
            handle.remove()
        sub.__dict__.pop(_OFFLOAD, None)
        remove_hook_from_module(sub)
    module.__dict__.pop("to", None)
    module.__dict__.pop("cuda", None)


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module`` has tensors that a dispatch hook loads just in time (they are on meta between calls)."""
    return _OFFLOAD in module.__dict__


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: Any = None) -> Iterator[None]:
    """Inside the block, ``module``'s own tensors are usable: offloaded ones are loaded (onto
    ``execution_device`` if given), others are moved to ``execution_device`` if given; all go back after.

    Example::

        with align_module_device(model.blocks[3]):
            weight = model.blocks[3].up.weight.clone()   # real values, even for a disk-offloaded block
    """
    if has_offloaded_params(module):
        load, unload = module.__dict__[_OFFLOAD]
        try:
            load(module, execution_device)
            yield
        finally:
            unload(module)
    elif execution_device is not None:
        devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def get_state_dict_from_offload(
    module: nn.Module, module_name: str, state_dict: dict[str, Any], device_to_put_offload: Any = "cpu"
) -> dict[str, Any]:
    """Fills ``state_dict``'s entries of ``module`` with real values: ``module_name`` is the dotted name of one of its
    tensors in the whole model (``"blocks.3.up.weight"``), so its siblings are ``"blocks.3.up.<key>"``. Offloaded
    tensors are read onto ``device_to_put_offload``; a module without offloaded tensors gives its own, where they are.
    Returns ``state_dict`` (changed in place), as transformers' ``save_pretrained`` of an offloaded model expects.

    Example::

        state_dict = model.state_dict()          # offloaded entries are on meta
        for name, module in model.named_modules():
            for key in module.state_dict():
                get_state_dict_from_offload(module, f"{name}.{key}", state_dict)
    """
    prefix = module_name.rpartition(".")[0]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, tensor in module.state_dict().items():
            name = f"{prefix}.{key}" if prefix else key
            if name in state_dict:
                state_dict[name] = tensor
    return state_dict


def guard_moves(model: nn.Module) -> None:
    """``model.to(...)`` / ``.cuda()`` on a dispatched model with offloaded tensors raises instead of half-moving it."""
    for method in ("to", "cuda"):
        original = getattr(model, method)

        def guarded(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if any(p.device.type == "meta" for p in model.parameters()):
                raise RuntimeError("You can't move a model that has some modules offloaded to cpu or disk.")
            return _original(*args, **kwargs)

        model.__dict__[method] = guarded
