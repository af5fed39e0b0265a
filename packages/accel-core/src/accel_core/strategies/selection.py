"""Deciding the run's plan from constructor arguments and environment: one pure function.

Precedence for every setting: the Accelerator's argument > the ``ACCEL_*`` environment variable
(written by ``accel launch`` from its flags and the config file) > the default.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import environment as env
from ..configuration import GradientAccumulationPlugin
from ..enums import DynamoBackend, PrecisionType, SchedulerStepping
from ..parallel.config import ParallelismConfig, requested_size

# The Accelerator arguments that select a backend, and the strategy each one selects.
PLUGIN_ARGUMENTS = {"deepspeed_plugin": "deepspeed", "fsdp_plugin": "fsdp", "megatron_lm_plugin": "megatron"}


@dataclass(frozen=True)
class StrategyPlan:
    """What the Accelerator will set up."""

    strategy: str  # an ``accel.strategies`` name, or "ddp" / "single_device"
    strategy_plugin: Any  # the user's plugin object for that strategy, or None
    mixed_precision: str
    gradient_accumulation: GradientAccumulationPlugin
    cpu: bool
    dynamo_backend: str
    scheduler_stepping: str = SchedulerStepping.PER_PROCESS.value


def resolve_strategy_plan(
    *,
    world_size: int,
    mixed_precision: str | None = None,
    gradient_accumulation_steps: int | None = None,
    gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
    cpu: bool = False,
    plugins: Mapping[str, Any] | None = None,
    strategy: str | None = None,
    dynamo_backend: str | None = None,
    scheduler_stepping: str | None = None,
    environ: Mapping[str, str] | None = None,
    parallelism: ParallelismConfig | None = None,
) -> StrategyPlan:
    """Resolves the plan; raises ValueError with the fix for contradictory inputs.

    plugins: the backend-selecting constructor arguments, e.g. ``{"fsdp_plugin": plugin}``.
    parallelism: the requested layout; sharding parameters (``dp_shard_size > 1``) or context
        parallelism (``cp_size > 1``) selects FSDP when nothing else names a strategy.
    """
    environ = {} if environ is None else environ

    precision = mixed_precision if mixed_precision is not None else env.get_str(env.MIXED_PRECISION, "no", environ)
    precision = str(precision).lower()
    if precision not in PrecisionType.list():
        raise ValueError(f"Unknown mixed_precision mode: {precision!r}. Choose between {PrecisionType.list()}.")

    if gradient_accumulation_steps == 1:  # the Accelerator's default, as the reference's: the environment may say more
        gradient_accumulation_steps = None
    if gradient_accumulation_plugin is not None:
        if (
            gradient_accumulation_steps is not None
            and gradient_accumulation_steps != gradient_accumulation_plugin.num_steps
        ):
            raise ValueError(
                "You can only pass one of `gradient_accumulation_steps` and `gradient_accumulation_plugin`: put "
                "the number of steps in the plugin (GradientAccumulationPlugin(num_steps=...)) and drop the other."
            )
        accumulation = gradient_accumulation_plugin
    else:
        steps = gradient_accumulation_steps
        if steps is None:
            steps = env.get_int(env.GRADIENT_ACCUMULATION_STEPS, 1, environ)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {steps!r}.")
        accumulation = GradientAccumulationPlugin(num_steps=steps)
    accumulation = keep_global_batch(accumulation, world_size, environ)

    given = {arg: plugin for arg, plugin in (plugins or {}).items() if plugin is not None}
    unknown = set(given) - set(PLUGIN_ARGUMENTS)
    if unknown:
        raise TypeError(f"Unknown backend plugin argument(s): {sorted(unknown)}; known: {sorted(PLUGIN_ARGUMENTS)}.")
    if len(given) > 1:
        raise ValueError(f"Pass only one backend plugin, got {sorted(given)}: they select different strategies.")
    strategy_plugin = next(iter(given.values()), None)
    if strategy is not None:
        if given and PLUGIN_ARGUMENTS[next(iter(given))] != strategy:
            raise ValueError(f"strategy={strategy!r} contradicts {next(iter(given))}: pass one of them.")
        name = strategy
    elif given:
        name = PLUGIN_ARGUMENTS[next(iter(given))]
    else:
        name = env.get_str(env.STRATEGY, None, environ) or ""
        if not name and _xla_configured(environ):
            name = "xla"
        if not name:
            wants_fsdp = any(requested_size(parallelism, dim, environ) > 1 for dim in ("dp_shard", "cp"))
            name = "fsdp" if wants_fsdp else "ddp" if world_size > 1 else "single_device"
    if name == "ddp" and world_size == 1:
        name = "single_device"  # DDP over one process only adds overhead

    dynamo = str(
        dynamo_backend if dynamo_backend is not None else env.get_str(env.DYNAMO_BACKEND, "no", environ)
    ).lower()
    if dynamo not in DynamoBackend.list():
        raise ValueError(f"Unknown dynamo_backend {dynamo!r}. Choose between {DynamoBackend.list()}.")

    stepping = (
        scheduler_stepping if scheduler_stepping is not None else env.get_str(env.SCHEDULER_STEPPING, None, environ)
    )
    stepping = str(stepping if stepping is not None else SchedulerStepping.PER_PROCESS).lower()
    if stepping not in SchedulerStepping.list():
        origin = "scheduler_stepping" if scheduler_stepping is not None else env.SCHEDULER_STEPPING
        raise ValueError(f"Unknown {origin} {stepping!r}. Choose between {SchedulerStepping.list()}.")

    return StrategyPlan(
        strategy=name,
        strategy_plugin=strategy_plugin,
        mixed_precision=precision,
        gradient_accumulation=accumulation,
        cpu=bool(cpu) or env.flag(env.USE_CPU, False, environ),
        dynamo_backend=dynamo,
        scheduler_stepping=stepping,
    )


def keep_global_batch(
    accumulation: GradientAccumulationPlugin, world_size: int, environ: Mapping[str, str]
) -> GradientAccumulationPlugin:
    """An elastic job running short of machines accumulates more micro-batches per optimizer step.

    ``ACCEL_GLOBAL_BATCH_PROCESSES`` (``accel launch --keep-global-batch``) is the world the script's
    accumulation is meant for, all machines taking part; with fewer processes each optimizer step
    accumulates ``full / world_size`` times more, so it averages the gradient over as many samples as the
    full world's step (the same samples, where the loader's position converts) and the step count of
    an epoch, the LR schedule's clock, does not change with the world.
    """
    full = env.get_int(env.GLOBAL_BATCH_PROCESSES, 0, environ)
    if not full or full == world_size:
        return accumulation
    if full % world_size:
        raise ValueError(
            f"{env.GLOBAL_BATCH_PROCESSES}={full} (--keep-global-batch): the {world_size} processes of this round "
            f"cannot keep the global batch of {full} processes by accumulating a whole number of micro-batches "
            "more; give every machine the same number of processes and use machine counts that divide the full "
            "one, or drop --keep-global-batch."
        )
    return dataclasses.replace(accumulation, num_steps=accumulation.num_steps * (full // world_size))


def _xla_configured(environ: Mapping[str, str]) -> bool:
    """An XLA device is configured (torch-xla's ``PJRT_DEVICE``) and a strategy named ``xla`` is installed (accel-xla):
    then it is the default, as Accelerate picks XLA when torch-xla is there. ``--cpu`` keeps the CPU. Without
    torch-xla itself installed, a stray ``PJRT_DEVICE`` does not turn a CPU/GPU run into an ImportError."""
    if not environ.get("PJRT_DEVICE") or env.flag(env.USE_CPU, False, environ):
        return False
    if importlib.util.find_spec("torch_xla") is None:
        return False
    from ..discovery import available

    return "xla" in available("accel.strategies")
