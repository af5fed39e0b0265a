"""How an Accelerator's run is assembled, in the order the decisions depend on each other.

``assemble`` is the constructor's set-up, apart from the parts: it settles the run's settings once from the
environment (``accel_core.settings``: another launcher's variables translated into a frozen record, ``os.environ``
only read), resolves the plan from the arguments and that record (``strategies.selection``), builds the Strategy,
asks it for the job's layout before any communication (a layout it refuses fails on every process alike), lets it
set up the process group and placement, creates the process state, builds the one named device mesh
(``parallel.dims``) and the strategy's Precision, then hands the strategy its ``StrategyContext`` and records the
choice in the process state, where the reference API reads it.

What it returns (``Assembly``) is all the Accelerator and its parts are built from; nothing here
knows the parts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from .. import environment as env
from ..configuration import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    InitProcessGroupKwargs,
    TorchDynamoPlugin,
)
from ..enums import SchedulerStepping
from ..parallel.config import ParallelismConfig
from ..parallel.dims import ParallelDims, make_dims
from ..precision.modes import PrecisionContext
from ..settings import RunSettings, settle
from ..state import AcceleratorSetup, AcceleratorState, GradientState, collective_timeout
from ..strategies import PreparedObjects, Strategy, StrategyContext, create_strategy, resolve_strategy_plan
from ..strategies.groups import coordination_group
from ..strategies.selection import PLUGIN_ARGUMENTS
from .arguments import dynamo_plugin_for, dynamo_settings, one_deepspeed_plugin
from .preparation import scheduler_steps_for


@dataclass(frozen=True)
class RunArguments:
    """The constructor arguments the set-up decides from, already in accel's shapes where a helper of
    ``arguments`` made them so (``handlers`` indexed by type, ``dataloader_config`` built)."""

    handlers: dict[type, Any]
    dataloader_config: DataLoaderConfiguration
    mixed_precision: str | None
    gradient_accumulation_steps: int | None
    gradient_accumulation_plugin: GradientAccumulationPlugin | None
    cpu: bool
    deepspeed_plugin: Any
    deepspeed_plugins: Any
    fsdp_plugin: Any
    megatron_lm_plugin: Any
    dynamo_backend: str | None
    dynamo_plugin: TorchDynamoPlugin | None
    parallelism_config: ParallelismConfig | None
    strategy: str | Strategy | None
    scheduler_stepping: str | SchedulerStepping | None
    device_placement: bool
    step_scheduler_with_optimizer: bool


@dataclass(frozen=True)
class Assembly:
    """The assembled run: the strategy, the context it was set up with (plan, state, mesh, precision, gradient
    state, prepared objects, handlers, dynamo plugin) and how prepared schedulers step."""

    strategy: Strategy
    context: StrategyContext
    scheduler_stepping: SchedulerStepping


def _check_types(arguments: RunArguments) -> None:
    if arguments.parallelism_config is not None and not isinstance(arguments.parallelism_config, ParallelismConfig):
        raise TypeError(
            f"parallelism_config must be an accel ParallelismConfig, got {type(arguments.parallelism_config).__name__}."
        )
    if arguments.strategy is not None and not isinstance(arguments.strategy, (str, Strategy)):
        raise TypeError(
            f'strategy must be a strategy name ("ddp", "fsdp", ...) or an accel_core Strategy instance, got '
            f"{type(arguments.strategy).__name__}: subclass accel_core.strategies.Strategy."
        )


def _process_group_kwargs(handlers: dict[type, Any], settings: RunSettings) -> dict[str, Any]:
    """``InitProcessGroupKwargs`` as keyword arguments; ``--collective-timeout`` reaches a backend's own group too."""
    init_kwargs = handlers[InitProcessGroupKwargs].to_kwargs() if InitProcessGroupKwargs in handlers else {}
    if settings.environ.get(env.COLLECTIVE_TIMEOUT):
        init_kwargs["timeout"] = collective_timeout(init_kwargs.get("timeout"), settings)
    return init_kwargs


def assemble(arguments: RunArguments) -> Assembly:
    """Decides and builds the run (see the module docstring); raises ValueError / TypeError naming the fix for
    arguments that contradict each other or the strategy."""
    _check_types(arguments)
    # Settled once, first: `accelerate launch`'s settings under accel's names, srun / mpirun / a PyTorchJob's
    # variables as torchrun's, in a frozen record; os.environ is only read.
    settings = settle(os.environ)
    deepspeed_plugin = one_deepspeed_plugin(arguments.deepspeed_plugin, arguments.deepspeed_plugins)
    dynamo = dynamo_settings(arguments.dynamo_backend, arguments.dynamo_plugin, settings.environ)
    given_strategy = arguments.strategy
    plan = resolve_strategy_plan(
        world_size=settings.world_size,
        mixed_precision=None if arguments.mixed_precision is None else str(arguments.mixed_precision),
        gradient_accumulation_steps=arguments.gradient_accumulation_steps,
        gradient_accumulation_plugin=arguments.gradient_accumulation_plugin,
        cpu=arguments.cpu,
        plugins={
            "deepspeed_plugin": deepspeed_plugin,
            "fsdp_plugin": arguments.fsdp_plugin,
            "megatron_lm_plugin": arguments.megatron_lm_plugin,
        },
        strategy=given_strategy.name if isinstance(given_strategy, Strategy) else given_strategy,
        dynamo_backend=None if dynamo is None else dynamo.backend.value,
        scheduler_stepping=None if arguments.scheduler_stepping is None else str(arguments.scheduler_stepping),
        environ=settings.environ,
        parallelism=arguments.parallelism_config,
    )
    if dynamo is None:
        dynamo = dynamo_plugin_for(plan.dynamo_backend, settings.environ)
    strategy = (
        given_strategy
        if isinstance(given_strategy, Strategy)
        else create_strategy(plan.strategy, plan.strategy_plugin, arguments.handlers, settings)
    )
    # Decided before any communication: a layout the strategy refuses fails on every process alike.
    layout, given_mesh = strategy.parallelism(arguments.parallelism_config, settings)
    init_kwargs = _process_group_kwargs(arguments.handlers, settings)
    # The stall report's threshold is the process state's, not an argument of the backend's group.
    placement = strategy.setup_environment(
        settings, **{k: v for k, v in init_kwargs.items() if k != "stall_report_after"}
    )
    state = AcceleratorState(
        mixed_precision=plan.mixed_precision, cpu=plan.cpu, placement=placement, settings=settings, **init_kwargs
    )
    if placement is not None and state.device != placement.device:
        raise ValueError(
            f"The process state already exists on {state.device} (a PartialState made before this Accelerator), "
            f"but the {strategy.name} strategy places this process on {placement.device}: create the Accelerator "
            "first."
        )
    dims = make_dims(
        layout, state.device.type, state.num_processes, state.process_index, given_mesh, dist.is_initialized()
    )
    if plan.mixed_precision not in strategy.supported_precisions:
        raise ValueError(
            f"mixed_precision={plan.mixed_precision!r} is not supported by the {strategy.name} strategy; use one of "
            f"{list(strategy.supported_precisions)}."
        )
    precision = strategy.make_precision(
        plan.mixed_precision,
        PrecisionContext(state.device, arguments.handlers, state.is_main_process, environ=settings.environ),
    )
    # What runs: DeepSpeed's config may settle another mode, fp8 on a device without it falls back.
    state.mixed_precision = precision.name
    scheduler_stepping = SchedulerStepping(plan.scheduler_stepping)
    context = StrategyContext(
        state=state,
        dims=dims,
        precision=precision,
        plan=plan,
        gradient_state=GradientState(plan.gradient_accumulation),
        prepared=PreparedObjects(),
        settings=settings,
        device_placement=arguments.device_placement,
        step_scheduler_with_optimizer=arguments.step_scheduler_with_optimizer,
        scheduler_steps_per_optimizer_step=scheduler_steps_for(
            scheduler_stepping, arguments.dataloader_config, dims.config.data_parallel_size
        ),
        dynamo_plugin=dynamo,
    )
    strategy.setup(context)
    if state.collectives is None:  # torch.distributed's processes (a backend's own runtime aside)
        # Collective, at the same point on every process: a gloo network problem fails here, not at the first save.
        coordination_group()
    _record_choice(state, strategy, dims, dynamo, arguments.deepspeed_plugins)
    return Assembly(strategy, context, scheduler_stepping)


def _record_choice(
    state: AcceleratorState, strategy: Strategy, dims: ParallelDims, dynamo: TorchDynamoPlugin, deepspeed_plugins: Any
) -> None:
    """Writes what was decided into the process state, where the reference API reads it
    (``state.distributed_type``, ``state.fsdp_plugin``, ``state.deepspeed_plugins`` ...)."""
    plugin_of = {arg: strategy.plugin if name == strategy.name else None for arg, name in PLUGIN_ARGUMENTS.items()}
    setup = AcceleratorSetup(
        dynamo_plugin=dynamo,
        parallelism_config=dims.config,
        device_mesh=dims.mesh,
        # as given (a dict naming the plugin), else the strategy's plugin, as the reference keeps it
        deepspeed_plugins=deepspeed_plugins
        if isinstance(deepspeed_plugins, Mapping)
        else plugin_of["deepspeed_plugin"],
    )
    state.record_choice(strategy.distributed_type, plugin_of, setup)
