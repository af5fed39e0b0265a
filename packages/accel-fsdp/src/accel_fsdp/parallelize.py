"""FSDP2's chain, one straight function read top to bottom (as torchtitan's ``parallelize_llama``).

``FSDPStrategy.parallelize`` with FSDP2: the technique functions of ``accel_core.transforms`` in their
order, with ``fully_shard`` as the data-parallel step. The units FSDP2 shards one by one are also the
blocks that are checkpointed and compiled; the plugin's wrap policy and ignored modules choose them
first, on the model as the user built it (they name the user's classes and modules), so accel-fsdp's
own decisions are made before core's techniques run and the sharding after them (``shard_model``
refuses units that a tensor-parallel step replaced instead of keeping). FSDP1 keeps core's
default chain (its wrapper is ``FSDPStrategy.prepare_model``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from accel_core.transforms import checkpoint_blocks, compile_blocks, compile_settings, compile_whole

from . import fsdp2, policies
from .plugin import FullyShardedDataParallelPlugin

if TYPE_CHECKING:
    from accel_core.prepared_model import ModelParts
    from accel_core.strategies import StrategyContext


def parallelize_fsdp2(
    model: nn.Module, plugin: FullyShardedDataParallelPlugin, context: StrategyContext, mesh: Any
) -> ModelParts:
    """Precision conversion, the units to shard (and the ignored modules), tensor parallelism over ``tp`` (2-D
    parameters once sharded), the context-parallel check, activation checkpointing and compile of each unit,
    ``fully_shard`` over ``mesh`` (``dp_shard_cp``, or ``(dp_replicate, dp_shard_cp)`` for HSDP) with the shards'
    values (``fsdp2.shard_model``), and the whole model compiled when it has no units. Collective."""
    config = context.dims.config
    model = context.precision.convert_module(model)
    ignored = policies.ignored_modules(model, plugin.ignored_modules)
    units = policies.units_to_wrap(model, plugin, ignored)
    if config.tp_enabled:
        from accel_core.transforms.tensor_parallel import apply_tensor_parallel

        model = apply_tensor_parallel(model, context.dims.submesh("tp"), config, context.precision)
    if config.cp_enabled:
        from accel_core.transforms.context_parallel import check_model

        check_model(model, config.size("cp"))
    if config.activation_checkpointing or plugin.activation_checkpointing:
        checkpoint_blocks(units, model)
    dynamo = compile_settings(context)
    if dynamo is not None and units:
        compile_blocks(units, **dynamo.to_kwargs())
    model = fsdp2.shard_model(
        model, plugin, units=units, ignored=ignored, mesh=mesh, device=context.device, precision=context.precision
    )
    # FSDP2 keeps the user's object: it is the wrapper and the module at once.
    return compile_whole(model, model, None if units else dynamo, unwrap=lambda sharded: sharded)
