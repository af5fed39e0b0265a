"""``torch.compile`` of prepared models, whole or by region (repeated blocks compiled one by one)."""

from __future__ import annotations

import copy
from typing import Any, TypeGuard

import torch

from .configuration import TorchDynamoPlugin


def _compile(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    # torch.compile is typed as returning a callable; given a Module it returns an OptimizedModule.
    compiled: Any = torch.compile(module, **compile_kwargs)
    return compiled


def _is_repeated_blocks(module: torch.nn.Module) -> TypeGuard[torch.nn.ModuleList]:
    return isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1


def _has_repeated_blocks(module: torch.nn.Module) -> bool:
    return any(_is_repeated_blocks(m) for m in module.modules())


def compile_regions(module: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compiles each block of a repeated stack (an ``nn.ModuleList`` of one class) separately, and
    the parts outside such stacks as wholes; the blocks share the compiler's cache, so the cold start is shorter.

    Returns a shallow copy of the containers; parameters are the same objects.
    """
    if _is_repeated_blocks(module):
        return torch.nn.ModuleList(_compile(block, **compile_kwargs) for block in module)
    if _has_repeated_blocks(module):
        copied = copy.copy(module)
        copied._modules = {name: compile_regions(child, **compile_kwargs) for name, child in module.named_children()}
        return copied
    return _compile(module, **compile_kwargs)


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin) -> torch.nn.Module:
    """``model`` compiled as ``plugin`` says (unchanged with backend ``"no"``)."""
    if plugin.backend == "no":
        return model
    kwargs = plugin.to_kwargs()
    if plugin.use_regional_compilation:
        return compile_regions(model, **kwargs)
    return _compile(model, **kwargs)
