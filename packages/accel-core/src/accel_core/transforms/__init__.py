"""Model transforms: small technique functions, each one step of a strategy's chain.

Each strategy turns one model into what it trains with one straight function, ``Strategy.parallelize``, read top to
bottom as torchtitan's ``parallelize_llama``. The default (``Strategy.parallelize`` in ``strategies/base.py``: one
device, DDP, XLA, Megatron, FSDP1) calls these functions in torchtitan's order:

1. precision conversion: ``precision.convert_module`` (the hook FP8 fills: swap layers for
   low-precision ones, before anything is split);
2. tensor parallelism over ``tp`` (``tensor_parallel``; skipped for a strategy whose own layers
   split the model, ``Strategy.splits_model_itself``), and the context-parallel model check;
3. activation checkpointing of each block (``checkpoint_blocks``; ``ParallelismConfig.activation_checkpointing`` or
   the strategy's own setting);
4. ``torch.compile`` of each block (``compile_blocks``; ``dynamo_backend``);
5. the strategy's data-parallel step (``Strategy.prepare_model``): replicas over ``dp`` (DDP;
   FSDP2-based replicas for tensor-parallel models), or placement on the device; a model built on
   the meta device is given memory and values there (``meta_init``);
6. ``torch.compile`` of the whole model when it has no blocks (``compile_whole``; with
   ``use_regional_compilation``, each block of a repeated stack on its own: ``compile_regions``).

Blocks come from ``Strategy.blocks(model)``: the classes of the model's ``_no_split_modules``. accel-fsdp's
``parallelize_fsdp2`` (``accel_fsdp.parallelize``) is the same steps with ``fully_shard`` at 5, its blocks the units
of the plugin's wrap policy, chosen before step 2 on the model as the user built it.

With ``pp_size > 1`` the Accelerator first splits the model into stages (``accel_core.pipelining``), and each stage
of this rank goes through the strategy's chain on its own.

A model prepared with ``evaluation_mode=True`` (only run forward, as in the reference) goes through
``Strategy.prepare_for_evaluation``: the precision conversion (1), ``Strategy.prepare_eval_model`` (placed, not
wrapped) in place of step 5, and the whole-model compile of step 6 whether or not it has blocks, as the reference
compiles it (``torch.compile`` of the model, or region by region with ``use_regional_compilation``); it is neither
split (2), checkpointed (3) nor compiled block by block (4): every process runs all of it, and the strategy's
blocks are not asked for.

Each chain returns the model's ``ModelParts`` (what runs forward, the wrapper, the user's module), from which
``prepare`` makes the model's one record (``accel_core.prepared_model``). These functions never import the
strategies: the chains call down into them, never the other way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn

from ..configuration import TorchDynamoPlugin
from ..prepared_model import ModelParts

if TYPE_CHECKING:
    from ..strategies.context import StrategyContext


def checkpoint_blocks(blocks: list[nn.Module], model: nn.Module) -> None:
    """Recomputes each block's activations in backward (torch's composable ``checkpoint``, names unchanged)."""
    from torch.distributed._composable import checkpoint

    if not blocks:
        raise ValueError(
            f"Activation checkpointing needs the blocks of {type(model).__name__}: set model._no_split_modules = "
            "['MyBlock'] (or, with FSDP, transformer_cls_names_to_wrap=['MyBlock'])."
        )
    for block in blocks:
        checkpoint(block)


def compile_blocks(blocks: list[nn.Module], **compile_kwargs: Any) -> None:
    """``torch.compile`` each block in place (module objects and parameter names unchanged)."""
    for block in blocks:
        block.compile(**compile_kwargs)


def compile_settings(context: StrategyContext) -> TorchDynamoPlugin | None:
    """How models are compiled (the ``TorchDynamoPlugin``, else the plan's ``dynamo_backend``); None: not at all."""
    dynamo = context.dynamo_plugin
    if dynamo is None:
        dynamo = TorchDynamoPlugin(backend=context.plan.dynamo_backend)
    return dynamo if dynamo.backend != "no" else None


def compile_whole(
    wrapped: nn.Module,
    module: nn.Module,
    dynamo: TorchDynamoPlugin | None,
    unwrap: Callable[[nn.Module], nn.Module],
) -> ModelParts:
    """The last step: ``torch.compile`` of the whole wrapped model, or region by region with
    ``use_regional_compilation=True`` (``compile_regions``); None compiles nothing. Returns the model's parts.

    unwrap: the strategy's ``unwrap_model``. Regional compilation runs a shallow copy of the containers on the path
    to the compiled regions, so the user's module that runs is the one inside that copy.
    """
    if dynamo is None:
        return ModelParts(runs=wrapped, wrapped=wrapped, module=module)
    if dynamo.use_regional_compilation:
        runs = compile_regions(wrapped, **dynamo.to_kwargs())
        return ModelParts(runs=runs, wrapped=runs, module=unwrap(runs))
    return ModelParts(runs=_compiled(wrapped, **dynamo.to_kwargs()), wrapped=wrapped, module=module)


def compile_regions(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compiles each block of a repeated stack (an ``nn.ModuleList`` of one class) separately, and the parts outside
    such stacks as wholes; the blocks share the compiler's cache, so the cold start is shorter.

    Returns a shallow copy of the containers; parameters are the same objects.
    """
    if _is_repeated_blocks(module):
        return nn.ModuleList(_compiled(block, **compile_kwargs) for block in module)
    if any(_is_repeated_blocks(m) for m in module.modules()):
        copied = copy.copy(module)
        copied._modules = {name: compile_regions(child, **compile_kwargs) for name, child in module.named_children()}
        return copied
    return _compiled(module, **compile_kwargs)


def _is_repeated_blocks(module: nn.Module) -> TypeGuard[nn.ModuleList]:
    return isinstance(module, nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1


def _compiled(module: nn.Module, **compile_kwargs: Any) -> nn.Module:
    # torch.compile is typed as returning a callable; given a Module it returns an OptimizedModule.
    compiled: Any = torch.compile(module, **compile_kwargs)
    return compiled
