"""Accelerate's ``ModelHook`` objects: callbacks around a module's ``forward`` that see its keyword arguments.

Frameworks built on Accelerate (transformers' generation and embedding resizing, PEFT's adapters
over offloaded layers, diffusers' model offloading) attach these hooks themselves and read them back
through ``module._hf_hook``. ``add_hook_to_module`` replaces the module's ``forward`` by one that runs
``hook.pre_forward``, the original forward (kept as ``module._old_forward``) and
``hook.post_forward``; ``remove_hook_from_module`` puts the original back.

- ``AlignDevicesHook``: inputs (and weights) to the execution device; with ``offload=True`` the
  weights live on meta between calls and are read from ``weights_map`` for each call;
- ``CpuOffload`` / ``cpu_offload_with_hook`` (``cpu_offload_hook.py``): a whole model kept on the CPU and moved to
  the execution device when it runs, until the next model of a pipeline needs the device;
- ``attach_align_device_hook`` & co: ``AlignDevicesHook`` on every submodule that has weights.

``dispatch_model`` / ``cpu_offload`` / ``disk_offload`` place weights with plain PyTorch hooks
(``hooks.py``); ``remove_hook_from_submodules`` removes both kinds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from accel_core.ops import send_to_device
from accel_core.structures import find_device

from .offload import PrefixedDataset, set_module_tensor_to_device
from .sizes import named_module_tensors

# Attributes the reference's dispatch adds to a model (guarded ``.to`` / ``.cuda``); removing a hook drops them.
_ADDED_ATTRIBUTES = ("to", "cuda", "npu", "xpu", "mlu", "sdaa", "musa")
TiedParamsMap = dict[int, dict[Any, torch.Tensor]]


class ModelHook:
    """Callbacks run around a module's forward by ``add_hook_to_module`` (unlike PyTorch's hooks, they get the
    keyword arguments). Subclasses override the events they need; every default leaves things unchanged.

    no_grad: run the module's own forward under ``torch.no_grad()``.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Run when the hook is attached; returns the module (possibly changed)."""
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Run just before the forward; returns the ``(args, kwargs)`` the forward gets."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Run just after the forward; returns the output the caller gets."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Run when the hook is removed; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order at each event (what ``add_hook_to_module(..., append=True)`` builds)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook: ModelHook = module._hf_hook  # pyright: ignore[reportAssignmentType]
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)  # pyright: ignore[reportCallIssue]
    else:
        output = module._old_forward(*args, **kwargs)  # pyright: ignore[reportCallIssue]
    return hook.post_forward(module, output)


def _set_forward(module: nn.Module, forward: Any) -> None:
    # An fx GraphModule's forward is its class's (an instance attribute would freeze the graph's code).
    if "GraphModuleImpl" in str(type(module)):
        type(module).forward = forward
    else:
        module.forward = forward


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Attaches ``hook`` to ``module``: its ``forward`` now runs ``hook.pre_forward``, the original forward and
    ``hook.post_forward``; ``module._hf_hook`` is the hook.

    A module that already has a hook gets the new one instead, or, with ``append=True``, both in a
    ``SequentialHook`` (the old one first). Returns the module (changed in place).
    """
    if append and getattr(module, "_hf_hook", None) is not None:
        old_hook: ModelHook = module._hf_hook  # pyright: ignore[reportAssignmentType]
        remove_hook_from_module(module)
        hook = SequentialHook(old_hook, hook)
    old_forward: Callable[..., Any]
    if hasattr(module, "_hf_hook") and "_old_forward" in module.__dict__:
        old_forward = module.__dict__["_old_forward"]  # replacing a hook: the original forward stays the one kept
    else:
        old_forward = module.forward
        module.__dict__["_old_forward"] = old_forward
    module = hook.init_hook(module)
    module.__dict__["_hf_hook"] = hook
    _set_forward(module, functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward))
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detaches the hook ``add_hook_to_module`` attached (``hook.detach_hook`` runs) and restores the original
    ``forward``; with ``recurse``, from every submodule too. Returns the module."""
    hook = module.__dict__.pop("_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
    if "_old_forward" in module.__dict__:
        _set_forward(module, module.__dict__.pop("_old_forward"))
    for attribute in _ADDED_ATTRIBUTES:
        module.__dict__.pop(attribute, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse)
    return module


class AlignDevicesHook(ModelHook):
    """Puts a module's inputs, and its weights, on ``execution_device`` for the forward.

    execution_device: where inputs and weights go (None: inputs stay where they are).
    offload: the weights live on the meta device between calls; each forward loads them from
        ``weights_map`` (default: a CPU copy taken when the hook is attached) and puts them back on meta.
    io_same_device: the output goes back to the device the inputs came from.
    weights_map: name -> tensor (possibly lazy: ``OffloadedWeightsLoader``, ``PrefixedDataset``).
    offload_buffers: offload the buffers too (else they are moved to ``execution_device`` once).
    place_submodules: also place (or offload) the submodules' tensors, not only the module's own.
    skip_keys: keyword arguments left where they are.
    tied_params_map: ``{data_ptr: {device: tensor}}`` shared by the hooks of a model: a tied weight
        already loaded on the execution device by another module is reused, not copied again.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: TiedParamsMap | None = None,
    ) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None  # the inputs' device, with io_same_device
        self.original_devices: dict[str, torch.device] = {}  # each tensor's device before offloading
        self.tied_params_names: set[str] = set()
        self.tied_pointers_to_remove: set[tuple[int, Any]] = set()

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _offloaded_tensors(self, module: nn.Module) -> list[str]:
        return [
            name
            for name, _ in named_module_tensors(
                module, include_buffers=self.offload_buffers, recurse=self.place_submodules, remove_non_persistent=True
            )
        ]

    def init_hook(self, module: nn.Module) -> nn.Module:
        if str(self.execution_device) == "meta":
            self.tied_params_map = None  # every meta tensor has data_ptr 0
        if not self.offload:
            if self.execution_device is not None:
                for name, _ in list(named_module_tensors(module, recurse=self.place_submodules)):
                    set_module_tensor_to_device(module, name, self.execution_device)
            return module
        tensors = dict(named_module_tensors(module, recurse=self.place_submodules))
        self.original_devices = {name: tensor.device for name, tensor in tensors.items()}
        if self.weights_map is None:
            self.weights_map = {
                name: tensor.to("cpu")
                for name, tensor in named_module_tensors(
                    module, include_buffers=self.offload_buffers, recurse=self.place_submodules
                )
            }
        for name in self._offloaded_tensors(module):
            if self.tied_params_map is not None and tensors[name].data_ptr() in self.tied_params_map:
                self.tied_params_names.add(name)
            set_module_tensor_to_device(module, name, "meta")
        if self.execution_device is not None:
            # Buffers that are not offloaded (all of them, or the non-persistent ones) live on the execution device.
            persistent = set(self._offloaded_tensors(module))
            for name, _ in list(module.named_buffers(recurse=self.place_submodules)):
                if name not in persistent:
                    set_module_tensor_to_device(module, name, self.execution_device)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        if self.offload:
            assert self.weights_map is not None  # set by init_hook
            device = self.execution_device if self.execution_device is not None else "cpu"
            for name in self._offloaded_tensors(module):
                value = self.weights_map[name]
                shared = self._tied_copy(name, value)
                set_module_tensor_to_device(module, name, device, value=value if shared is None else shared)
                if shared is None:
                    self._remember_tied(name, value, module)
        if self.execution_device is None:
            return args, kwargs
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device, skip_keys=self.skip_keys
        )

    def _tied_copy(self, name: str, value: torch.Tensor) -> torch.Tensor | None:
        """The copy of tied weight ``value`` another module already put on the execution device, if any."""
        if self.tied_params_map is None or name not in self.tied_params_names:
            return None
        return self.tied_params_map.get(value.data_ptr(), {}).get(self.execution_device)

    def _remember_tied(self, name: str, value: torch.Tensor, module: nn.Module) -> None:
        if self.tied_params_map is None or name not in self.tied_params_names:
            return
        owner_name, _, attribute = name.rpartition(".")
        loaded = getattr(module.get_submodule(owner_name), attribute)
        key = self.execution_device
        self.tied_params_map.setdefault(value.data_ptr(), {})[key] = loaded
        self.tied_pointers_to_remove.add((value.data_ptr(), key))

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for name in self._offloaded_tensors(module):
                set_module_tensor_to_device(module, name, "meta")
            # Drop this call's tied copies, so that their memory is freed once no module uses them.
            for pointer, device in self.tied_pointers_to_remove:
                if self.tied_params_map is not None:
                    self.tied_params_map.get(pointer, {}).pop(device, None)
            self.tied_pointers_to_remove = set()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        if self.offload and self.weights_map is not None:
            # Offloaded tensors go back where they were (with their values) before the hook took them.
            for name, device in self.original_devices.items():
                if device.type != "meta":
                    value = self.weights_map.get(name)
                    set_module_tensor_to_device(module, name, device, value=value)
        return module


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: TiedParamsMap | None = None,
) -> None:
    """An ``AlignDevicesHook`` moving inputs to ``execution_device`` on every submodule that has tensors and no hook
    yet (not below a module of a ``preload_module_classes`` class)."""
    if not hasattr(module, "_hf_hook") and len(module.state_dict()) > 0:
        add_hook_to_module(
            module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map)
        )
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(child, execution_device, skip_keys, preload_module_classes, tied_params_map)


def attach_align_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload: bool = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: TiedParamsMap | None = None,
) -> None:
    """An ``AlignDevicesHook`` on every submodule with tensors of its own (chained after an existing hook).

    weights_map: the whole model's weights; each hook reads its module's share under ``module_name``.
    A module of a ``preload_module_classes`` class, offloaded, loads its whole subtree in one hook.
    """
    full_offload = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if any(True for _ in named_module_tensors(module)) or full_offload:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(
            execution_device=execution_device,
            offload=offload,
            weights_map=None if weights_map is None else PrefixedDataset(weights_map, prefix),
            offload_buffers=offload_buffers,
            place_submodules=full_offload,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if full_offload:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device=execution_device,
            offload=offload,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: int | str | torch.device | Mapping[str, Any] | None = None,
    offload: bool | Mapping[str, bool] = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: TiedParamsMap | None = None,
) -> None:
    """``AlignDevicesHook`` on the blocks of a device map: ``execution_device`` and ``offload`` are one value for
    the whole module, or ``{block name: value}``. A block that is not offloaded gets one hook placing it whole on
    its device; an offloaded one gets a hook per submodule loading its weights for each call."""
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        if not offload:
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=execution_device,
                    io_same_device=True,
                    skip_keys=skip_keys,
                    place_submodules=True,
                    tied_params_map=tied_params_map,
                ),
            )
        else:
            attach_align_device_hook(
                module,
                execution_device=execution_device,
                offload=True,
                weights_map=weights_map,
                offload_buffers=offload_buffers,
                module_name=module_name,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            )
        return
    if isinstance(execution_device, Mapping):
        devices: Mapping[str, Any] = execution_device
    else:
        assert isinstance(offload, Mapping)  # one of the two is a mapping past the early return above
        devices = dict.fromkeys(offload, execution_device)
    offloads: Mapping[str, bool] = offload if isinstance(offload, Mapping) else dict.fromkeys(devices, offload)
    if module_name in devices and module_name in offloads and not offloads[module_name]:
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=devices[module_name],
                offload_buffers=offload_buffers,
                io_same_device=module_name == "",
                place_submodules=True,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            ),
        )
        attach_execution_device_hook(module, devices[module_name], skip_keys=skip_keys, tied_params_map=tied_params_map)
    elif module_name in devices and module_name in offloads:
        attach_align_device_hook(
            module,
            execution_device=devices[module_name],
            offload=True,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=module_name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
        if not hasattr(module, "_hf_hook"):
            add_hook_to_module(
                module,
                AlignDevicesHook(
                    execution_device=devices[module_name],
                    io_same_device=module_name == "",
                    skip_keys=skip_keys,
                    tied_params_map=tied_params_map,
                ),
            )
        attach_execution_device_hook(
            module,
            devices[module_name],
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
    elif module_name == "":
        add_hook_to_module(
            module,
            AlignDevicesHook(
                execution_device=devices.get(""),
                io_same_device=True,
                skip_keys=skip_keys,
                tied_params_map=tied_params_map,
            ),
        )
    for child_name, child in module.named_children():
        attach_align_device_hook_on_blocks(
            child,
            execution_device=devices,
            offload=offloads,
            weights_map=weights_map,
            offload_buffers=offload_buffers,
            module_name=f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys=skip_keys,
            preload_module_classes=preload_module_classes,
            tied_params_map=tied_params_map,
        )
