"""Model transforms: one documented order, each step a small function over a sub-mesh.

``prepare_model`` applies, in torchtitan's order:

0. with ``pp_size > 1``, the pipeline split (``accel_core.pipelining``): the model is cut into
   stages, this rank keeps its own, and each of them goes through steps 1-5; the result is a
   ``PipelinedModel`` holding them and their schedule;
1. precision conversion: ``precision.convert_module`` (the hook FP8 fills: swap layers for
   low-precision ones, before anything is split);
2. tensor parallelism over ``tp`` (``tensor_parallel``; skipped for a strategy whose own layers
   split the model, ``Strategy.splits_model_itself``), and the context-parallel model check;
3. activation checkpointing of each block (``ParallelismConfig.activation_checkpointing`` or the
   strategy's own setting);
4. ``torch.compile`` of each block (``dynamo_backend``; the whole model when it has no blocks);
5. the strategy's data-parallel step (``Strategy.prepare_model``): FSDP2 over ``dp_shard_cp`` (HSDP
   over ``dp_replicate x dp_shard_cp``) in accel-fsdp, or replicas over ``dp`` (DDP; FSDP2-based
   replicas for tensor-parallel models) in core; a model built on the meta device is given memory
   and values there.

Blocks come from ``Strategy.blocks(model)``: FSDP's units, else the classes of the model's
``_no_split_modules``.

A model prepared with ``evaluation_mode=True`` (only run forward, as in the reference) gets the
precision conversion (1), compilation (4) and ``Strategy.prepare_eval_model`` (placed, not wrapped) in
place of step 5; it is neither split (0, 2) nor checkpointed (3): every process runs all of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from ..compilation import compile_model
from ..configuration import TorchDynamoPlugin

if TYPE_CHECKING:
    from ..strategies.base import Strategy
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


def prepare_model(
    model: nn.Module,
    context: StrategyContext,
    strategy: Strategy,
    device_placement: bool,
    evaluation_mode: bool = False,
) -> nn.Module:
    """Runs the chain of the module docstring on ``model``; returns the prepared model.

    evaluation_mode: the model is only run forward: placed, not split nor wrapped (see the module docstring).
    """
    if evaluation_mode:
        return _chain(model, context, strategy, device_placement, evaluation_mode=True)
    if context.dims.config.pp_enabled and not strategy.splits_model_itself:
        from ..pipelining import prepare_pipeline

        return prepare_pipeline(
            model, context, strategy, lambda stage: _chain(stage, context, strategy, device_placement)
        )
    return _chain(model, context, strategy, device_placement)


def _chain(
    model: nn.Module,
    context: StrategyContext,
    strategy: Strategy,
    device_placement: bool,
    evaluation_mode: bool = False,
) -> nn.Module:
    """Steps 1-5 of the module docstring (1, 4 and the strategy's ``prepare_eval_model`` in evaluation mode)."""
    config = context.dims.config
    model = context.precision.convert_module(model)
    if config.tp_enabled and not strategy.splits_model_itself and not evaluation_mode:
        from .tensor_parallel import apply_tensor_parallel

        model = apply_tensor_parallel(model, context.dims.submesh("tp"), config, context.precision)
    if config.cp_enabled and not evaluation_mode:
        from .context_parallel import check_model

        check_model(model, config.size("cp"))
    blocks = strategy.blocks(model)
    if (config.activation_checkpointing or strategy.activation_checkpointing) and not evaluation_mode:
        checkpoint_blocks(blocks, model)
    dynamo = context.dynamo_plugin
    if dynamo is None:
        dynamo = TorchDynamoPlugin(backend=context.plan.dynamo_backend)
    compiles = dynamo.backend != "no"
    if compiles and blocks:
        compile_blocks(blocks, **dynamo.to_kwargs())
    if evaluation_mode:
        model = strategy.prepare_eval_model(model, device_placement=device_placement)
    else:
        model = strategy.prepare_model(model, device_placement=device_placement)
    if compiles and not blocks:
        # Whole, or region by region with TorchDynamoPlugin(use_regional_compilation=True).
        model = compile_model(model, dynamo)
    return model
