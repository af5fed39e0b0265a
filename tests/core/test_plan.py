"""The plan resolution is a pure function: argument > ACCEL_* environment > default."""

from __future__ import annotations

import pytest

from accel_core.configuration import GradientAccumulationPlugin
from accel_core.strategies import resolve_strategy_plan


def test_defaults_single_and_multi_process():
    assert resolve_strategy_plan(world_size=1).strategy == "single_device"
    plan = resolve_strategy_plan(world_size=2)
    assert (plan.strategy, plan.mixed_precision, plan.gradient_accumulation.num_steps, plan.cpu) == (
        "ddp",
        "no",
        1,
        False,
    )


def test_argument_beats_environment_beats_default():
    environ = {"ACCEL_MIXED_PRECISION": "bf16", "ACCEL_GRADIENT_ACCUMULATION_STEPS": "4", "ACCEL_USE_CPU": "true"}
    from_env = resolve_strategy_plan(world_size=2, environ=environ)
    assert (from_env.mixed_precision, from_env.gradient_accumulation.num_steps, from_env.cpu) == ("bf16", 4, True)
    from_args = resolve_strategy_plan(
        world_size=2, mixed_precision="fp16", gradient_accumulation_steps=2, environ=environ
    )
    assert (from_args.mixed_precision, from_args.gradient_accumulation.num_steps) == ("fp16", 2)


def test_strategy_from_plugin_environment_or_argument():
    marker = object()
    plan = resolve_strategy_plan(world_size=2, plugins={"fsdp_plugin": marker})
    assert plan.strategy == "fsdp" and plan.strategy_plugin is marker
    assert resolve_strategy_plan(world_size=2, environ={"ACCEL_STRATEGY": "deepspeed"}).strategy == "deepspeed"
    chosen = resolve_strategy_plan(world_size=2, strategy="fsdp", environ={"ACCEL_STRATEGY": "deepspeed"}).strategy
    assert chosen == "fsdp"
    assert resolve_strategy_plan(world_size=1, strategy="ddp").strategy == "single_device"


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        ({"mixed_precision": "fp7"}, ValueError, "Unknown mixed_precision mode"),
        ({"environ": {"ACCEL_MIXED_PRECISION": "int4"}}, ValueError, "Unknown mixed_precision mode"),
        ({"gradient_accumulation_steps": 0}, ValueError, ">= 1"),
        ({"environ": {"ACCEL_GRADIENT_ACCUMULATION_STEPS": "two"}}, ValueError, "must be an integer"),
        (
            {"gradient_accumulation_steps": 3, "gradient_accumulation_plugin": GradientAccumulationPlugin(num_steps=2)},
            ValueError,
            "only pass one of `gradient_accumulation_steps` and `gradient_accumulation_plugin`",
        ),
        ({"plugins": {"fsdp_plugin": 1, "deepspeed_plugin": 2}}, ValueError, "only one backend plugin"),
        ({"plugins": {"fsdp_plugin": 1}, "strategy": "deepspeed"}, ValueError, "contradicts"),
        ({"dynamo_backend": "warp"}, ValueError, "Unknown dynamo_backend"),
        ({"environ": {"ACCEL_USE_CPU": "maybe"}}, ValueError, "ACCEL_USE_CPU"),
    ],
)
def test_contradictions_are_clear_errors(kwargs, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace("`", ".")):
        resolve_strategy_plan(world_size=2, **kwargs)


def test_plugin_with_matching_steps_is_accepted():
    plugin = GradientAccumulationPlugin(num_steps=3)
    assert (
        resolve_strategy_plan(
            world_size=1, gradient_accumulation_steps=3, gradient_accumulation_plugin=plugin
        ).gradient_accumulation
        is plugin
    )


def test_scheduler_stepping_argument_environment_default():
    assert resolve_strategy_plan(world_size=2).scheduler_stepping == "per_process"  # Accelerate's stepping
    environ = {"ACCEL_SCHEDULER_STEPPING": "per_optimizer_step"}
    assert resolve_strategy_plan(world_size=2, environ=environ).scheduler_stepping == "per_optimizer_step"
    assert (
        resolve_strategy_plan(world_size=2, scheduler_stepping="per_process", environ=environ).scheduler_stepping
        == "per_process"
    )
    with pytest.raises(ValueError, match=r"ACCEL_SCHEDULER_STEPPING 'twice'.*per_optimizer_step"):
        resolve_strategy_plan(world_size=2, environ={"ACCEL_SCHEDULER_STEPPING": "twice"})
