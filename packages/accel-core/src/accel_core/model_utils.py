"""Helpers on ``nn.Module`` objects that scripts call directly: unwrap a prepared model, inspect compiled ones.

Example::

    from accel.utils import extract_model_from_parallel

    plain = extract_model_from_parallel(prepared_model)   # the user's module, out of DDP / FSDP / DeepSpeed
    torch.save(plain.state_dict(), "weights.pt")
"""

from __future__ import annotations

import sys
from functools import reduce
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from torch._dynamo.eval_frame import OptimizedModule

from . import discovery
from .precision.modes import unwrap_forward


def is_compiled_module(module: nn.Module) -> TypeGuard[OptimizedModule]:
    """Whether ``module`` is what ``torch.compile(model)`` returned."""
    return hasattr(torch, "_dynamo") and isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def uncompiled(module: nn.Module) -> nn.Module:
    """The module inside ``torch.compile``'s wrapper, or ``module`` itself when it is not one."""
    return module._orig_mod if is_compiled_module(module) else module


def has_compiled_regions(module: nn.Module) -> bool:
    """Whether some submodule of ``module`` was compiled with ``torch.compile``."""
    if not hasattr(torch, "_dynamo") or not module._modules:
        return False
    return any(isinstance(m, torch._dynamo.eval_frame.OptimizedModule) for m in module.modules())


def model_has_dtensor(model: nn.Module) -> bool:
    """Whether some parameter of ``model`` is a ``DTensor`` (sharded by FSDP2 or tensor parallelism)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


WRAPPERS = "accel.model_wrappers"


def _wrapper_types() -> tuple[type, ...]:
    """The containers whose ``.module`` is the user's model: torch's, and those backends register.

    A backend package registers its library's wrapper under ``accel.model_wrappers``, named by the
    module that defines it (accel-deepspeed: ``deepspeed`` -> ``DeepSpeedEngine``). It is loaded
    only once that module is imported: a model cannot be wrapped by a library nobody imported, and
    unwrapping must not import DeepSpeed.
    """
    types: list[type] = [nn.parallel.DistributedDataParallel, nn.DataParallel]
    if torch.distributed.is_available():
        from torch.distributed.fsdp import FullyShardedDataParallel

        types.append(FullyShardedDataParallel)
    types += [discovery.load(WRAPPERS, name) for name in discovery.available(WRAPPERS) if name in sys.modules]
    return tuple(types)


def extract_model_from_parallel(
    model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True, recursive: bool = False
) -> nn.Module:
    """The user's module from inside the containers ``prepare`` (or the user) put around it.

    Unwraps DDP, DataParallel, FSDP1 and the wrappers backends register (a DeepSpeed engine,
    Megatron-core's DDP; FSDP2 keeps the user's object). keep_fp32_wrapper: False also removes the
    mixed-precision forward wrapper. keep_torch_compile: False returns the module inside a
    ``torch.compile`` wrapper. recursive: also unwrap ``.module`` containers among the submodules.
    """
    compiled: nn.Module | None = None
    if is_compiled_module(model):
        compiled, model = model, model._orig_mod
    elif has_compiled_regions(model) and "_orig_mod" in model.__dict__:
        compiled, model = model, cast(nn.Module, model.__dict__["_orig_mod"])

    wrappers = _wrapper_types()
    while isinstance(model, wrappers):
        model = cast(nn.Module, model.module)  # each wrapper type holds the user's module in .module

    if recursive:
        model = _unwrap_children(model)
    if not keep_fp32_wrapper:
        unwrap_forward(model)
    if keep_torch_compile and compiled is not None:
        if is_compiled_module(compiled):
            compiled._orig_mod = model
        else:
            compiled.__dict__["_orig_mod"] = model
        model = compiled
    return model


def _unwrap_children(module: nn.Module) -> nn.Module:
    wrapped = getattr(module, "module", None)  # any container of a module, not only the known wrappers
    inner = _unwrap_children(wrapped) if isinstance(wrapped, nn.Module) else module
    for name, child in list(inner.named_children()):
        setattr(inner, name, _unwrap_children(child))
    return inner


def get_module_children_bottom_up(model: nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every submodule of ``model``, children before their parents; ``model`` itself last.

    return_fqns: ``(qualified name, module)`` pairs instead of modules.
    """
    ordered: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        name, module = stack.pop()
        stack += [
            (f"{name}.{child_name}" if name else child_name, child) for child_name, child in module.named_children()
        ]
        ordered.append((name, module))
    ordered.reverse()
    return ordered if return_fqns else [module for _, module in ordered]


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``getattr`` along a dotted path: ``recursive_getattr(model, "encoder.layer.0")``."""
    return reduce(getattr, attr.split("."), obj)


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT (LoRA, ...) ``PeftModel``; False when peft is not installed."""
    from .compat.availability import is_peft_available

    if not is_peft_available():
        return False
    from peft import PeftModel  # pyright: ignore[reportMissingImports]  # optional, not installed in the workspace

    return isinstance(model, PeftModel)


def get_model_tp_size(model: nn.Module) -> int | None:
    """The tensor-parallel degree a ``transformers`` model was sharded with (``from_pretrained(tp_plan=...)``),
    or None when it was not sharded.

    ``transformers`` < 5 records it as ``model.tp_size``; 5 and later in ``model.config.distributed_config``
    (a dict or an object), leaving ``model.tp_size`` as None.
    """
    # Attributes of transformers' own classes, read where each version keeps them.
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:
        return tp_size
    distributed_config = getattr(getattr(model, "config", None), "distributed_config", None)
    if isinstance(distributed_config, dict):
        return distributed_config.get("tp_size")
    return getattr(distributed_config, "tp_size", None)


def get_module_class_from_name(module: nn.Module, name: str) -> type[nn.Module] | None:
    """The class named ``name`` among ``module`` and its submodules (depth first), or None: how a layer class given by
    name (``transformer_layer_cls_to_wrap="LlamaDecoderLayer"``) is found in a model.

    Example::

        block_class = get_module_class_from_name(model, "Block")   # the class of model.blocks[0], or None
    """
    if type(module).__name__ == name:
        return type(module)
    for child in module.children():
        found = get_module_class_from_name(child, name)
        if found is not None:
            return found
    return None
