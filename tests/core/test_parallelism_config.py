"""The mesh layout without processes: ParallelismConfig resolution, strategy choice, launch flags and
config keys, the Strategy contract's refusals, the transform chain's checks, meta-device init."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import ClassVar

import pytest
import torch
from torch import nn

from accel_core.parallel.config import ParallelismConfig, resolve_parallelism
from accel_core.parallel.dims import mesh_dims
from accel_core.settings import settle
from accel_core.strategies import DDPStrategy, create_strategy, resolve_strategy_plan
from accel_launch.accelerate_import import convert_accelerate_config
from accel_launch.plan import resolve_plan as resolve_launch_plan

# A process of a 4-process torchrun job on one machine, as the Accelerator settles it.
FOUR_PROCESSES = settle({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"})


def test_unset_sizes_fill_the_world_with_the_strategys_data_parallel_dimension() -> None:
    config = resolve_parallelism(ParallelismConfig(tp_size=2), 8)
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size, config.cp_size, config.pp_size) == (
        4,
        1,
        2,
        1,
        1,
    )
    config = resolve_parallelism(ParallelismConfig(tp_size=2), 8, data_parallel_dim="dp_shard")
    assert (config.dp_replicate_size, config.dp_shard_size) == (1, 4)
    config = resolve_parallelism(ParallelismConfig(dp_replicate_size=2, tp_size=2), 8)
    assert (
        config.dp_shard_size == 2
        and config.data_parallel_size == 4
        and config.dp_dim_names == ["dp_replicate", "dp_shard"]
    )
    assert resolve_parallelism(None, 1).total_size == 1
    # The given config is not changed: resolution returns a copy.
    given = ParallelismConfig(tp_size=2)
    resolve_parallelism(given, 4)
    assert given.dp_replicate_size is None


def test_argument_beats_environment_beats_default() -> None:
    environ = {"ACCEL_TP_SIZE": "2", "ACCEL_DP_SHARD_SIZE": "2"}
    config = resolve_parallelism(None, 4, environ=environ)
    assert (config.dp_replicate_size, config.dp_shard_size, config.tp_size) == (1, 2, 2)
    config = resolve_parallelism(ParallelismConfig(tp_size=4), 8, environ=environ)
    assert (config.dp_shard_size, config.tp_size) == (2, 4)


@pytest.mark.parametrize(
    "config, world, environ, fragment",
    [
        (ParallelismConfig(dp_shard_size=3), 4, {}, "need a multiple of 3 processes, but the job has 4"),
        (ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2), 4, {}, "need a multiple of 8"),
        (ParallelismConfig(dp_replicate_size=1, dp_shard_size=2), 4, {}, "multiply to 2, but the job has 4 processes"),
        (ParallelismConfig(pp_size=2, pp_schedule="1f1b", pp_stages_per_rank=2), 4, {}, "runs one stage per rank"),
        (ParallelismConfig(pp_size=2), 4, {"ACCEL_PP_SCHEDULE": "zb"}, "ACCEL_PP_SCHEDULE='zb'"),
        (None, 4, {"ACCEL_TP_SIZE": "0"}, "ACCEL_TP_SIZE=0"),
        (None, 4, {"ACCEL_CP_SIZE": "two"}, "must be an integer"),
    ],
)
def test_bad_layouts_name_the_sizes_and_the_world(config, world, environ, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        resolve_parallelism(config, world, environ=environ)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"tp_size": 0}, "tp_size must be an integer >= 1"),
        ({"dp_shard_size": 2.0}, "dp_shard_size must be an integer"),
        ({"cp_comm_strategy": "ring"}, "cp_comm_strategy"),
        ({"tp_plan": {}, "parallelize_fn": print}, "either tp_plan or parallelize_fn"),
    ],
)
def test_config_checks_its_own_fields(kwargs, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        ParallelismConfig(**kwargs)


def test_sharding_or_context_parallelism_selects_fsdp_unless_a_strategy_is_named() -> None:
    assert resolve_strategy_plan(world_size=4, parallelism=ParallelismConfig(dp_shard_size=2)).strategy == "fsdp"
    assert resolve_strategy_plan(world_size=4, parallelism=ParallelismConfig(cp_size=2)).strategy == "fsdp"
    assert resolve_strategy_plan(world_size=4, environ={"ACCEL_DP_SHARD_SIZE": "4"}).strategy == "fsdp"
    assert resolve_strategy_plan(world_size=4, parallelism=ParallelismConfig(tp_size=2)).strategy == "ddp"
    chosen = resolve_strategy_plan(
        world_size=4, strategy="ddp", parallelism=ParallelismConfig(dp_shard_size=2)
    ).strategy
    assert chosen == "ddp"


def test_core_strategies_refuse_sharding_and_name_the_fix() -> None:
    strategy = create_strategy("ddp")
    with pytest.raises(ValueError, match=r"needs FSDP2.*fsdp_plugin"):
        strategy.parallelism(ParallelismConfig(dp_shard_size=2), FOUR_PROCESSES)
    config, mesh = strategy.parallelism(ParallelismConfig(tp_size=2), FOUR_PROCESSES)
    assert (config.dp_replicate_size, config.tp_size, mesh) == (2, 2, None)
    with pytest.raises(TypeError, match="takes no plugin"):
        DDPStrategy.from_plugin(object(), {}, FOUR_PROCESSES)


def test_whole_engine_strategies_refuse_a_mesh_they_cannot_honour() -> None:
    from accel_deepspeed import DeepSpeedPlugin, DeepSpeedStrategy

    deepspeed = DeepSpeedStrategy.from_plugin(DeepSpeedPlugin(zero_stage=2), {}, FOUR_PROCESSES)
    assert deepspeed.parallelism(None, FOUR_PROCESSES)[0].dp_shard_size == 4  # ZeRO shards over every process
    for config in (ParallelismConfig(tp_size=2), ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)):
        with pytest.raises(ValueError, match="DeepSpeed strategy cannot honour"):
            deepspeed.parallelism(config, FOUR_PROCESSES)


@pytest.mark.slow
def test_refusing_a_deepspeed_mesh_imports_neither_deepspeed_nor_starts_processes() -> None:
    code = (
        "import sys\n"
        "from accel import Accelerator, ParallelismConfig, DeepSpeedPlugin\n"
        "try:\n"
        "    Accelerator(deepspeed_plugin=DeepSpeedPlugin(), parallelism_config=ParallelismConfig(cp_size=2))\n"
        "except ValueError as e:\n"
        "    assert 'cannot honour cp_size=2' in str(e), e\n"
        "import torch.distributed as dist\n"
        "assert 'deepspeed' not in sys.modules and not dist.is_initialized()\n"
        "print('ok')\n"
    )
    # Rank 0 of 2 as torchrun would set it: the layout is decided (and refused) before any process group.
    environ = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_mesh_keeps_both_data_parallel_dimensions_and_skips_unused_ones() -> None:
    assert mesh_dims(resolve_parallelism(None, 2)) == (("dp_replicate", "dp_shard"), (2, 1))
    config = resolve_parallelism(ParallelismConfig(dp_shard_size=2, cp_size=2, tp_size=2), 8)
    assert mesh_dims(config) == (("dp_replicate", "dp_shard", "cp", "tp"), (1, 2, 2, 2))


def test_launch_flags_environment_and_config_file_reach_the_workers() -> None:
    plan = resolve_launch_plan(
        {"num_processes": 8, "tp_size": 2}, {"ACCEL_TP_SIZE": "4", "ACCEL_CP_SIZE": "2"}, {"dp_shard_size": 2}
    )
    assert (plan.tp_size, plan.cp_size, plan.dp_shard_size) == (2, 2, 2)
    assert (
        plan.env["ACCEL_TP_SIZE"] == "2" and plan.env["ACCEL_CP_SIZE"] == "2" and plan.env["ACCEL_DP_SHARD_SIZE"] == "2"
    )
    assert "ACCEL_DP_REPLICATE_SIZE" not in plan.env  # unset: the Accelerator fills it
    with pytest.raises(ValueError, match=r"tp_size=3 \(product 3\) must divide 4"):
        resolve_launch_plan({"num_processes": 4, "tp_size": 3}, {}, {})
    with pytest.raises(ValueError, match="must equal 4"):
        resolve_launch_plan({"num_processes": 4, "dp_replicate_size": 1, "dp_shard_size": 2}, {}, {})
    with pytest.raises(ValueError, match=r"config file .* key 'tp_size'"):
        resolve_launch_plan({}, {}, {"tp_size": "x"}, config_file="c.yaml")


def test_accel_launch_flags_and_accelerates_spellings() -> None:
    from accel.commands.launch import build_parser

    parser = build_parser([])
    namespace = parser.parse_args(["--tp-size", "2", "--parallelism_config_dp_shard_size", "2", "-n", "4", "train.py"])
    assert (namespace.tp_size, namespace.dp_shard_size, namespace.num_processes) == (2, 2, 4)
    assert isinstance(parser, argparse.ArgumentParser)
    config, warnings = convert_accelerate_config(
        {
            "parallelism_config": {
                "parallelism_config_tp_size": 2,
                "parallelism_config_dp_shard_size": 4,
                "parallelism_config_sp_size": 2,
            }
        }
    )
    assert config == {"tp_size": 2, "dp_shard_size": 4} and len(warnings) == 1 and "sp_size" in warnings[0]


def test_import_accel_exports_parallelism_config_without_torch() -> None:
    code = (
        "import sys, accel, accel.utils\n"
        "assert accel.ParallelismConfig is accel.utils.ParallelismConfig\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr


def test_one_process_has_a_trivial_layout_and_no_mesh() -> None:
    from accel_core import Accelerator

    accelerator = Accelerator(cpu=True)
    assert accelerator.device_mesh is None and accelerator.parallelism_config.total_size == 1
    assert (accelerator.parallel_dims.dp.size, accelerator.tensor_parallel_rank, accelerator.data_parallel_rank) == (
        1,
        0,
        0,
    )
    with accelerator.maybe_context_parallel(buffers=[torch.zeros(2, 4)], buffer_seq_dims=[1]):
        pass  # context parallelism off: the block just runs


def test_tensor_parallel_plans_are_checked_before_anything_is_split() -> None:
    from accel_core.transforms.tensor_parallel import check_plan, matching_modules

    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 8))
    assert [name for name, _ in matching_modules(nn.ModuleDict({"a": model}), "a.*")] == ["a.0", "a.1", "a.2"]
    with pytest.raises(ValueError, match=r"tp_size=4 must divide 0\.out_features=6"):
        check_plan(model, {"0": "colwise"}, 4)
    with pytest.raises(ValueError, match=r"must divide 2\.in_features=6"):
        check_plan(model, {"2": "rowwise"}, 4)
    with pytest.raises(ValueError, match="matches no submodule"):
        check_plan(model, {"layers.*.q": "colwise"}, 2)
    with pytest.raises(ValueError, match="one of the names colwise"):
        check_plan(model, {"0": "diagonal"}, 2)
    assert set(check_plan(model, {"0": "colwise", "2": "rowwise"}, 2)) == {"0", "2"}


def test_context_parallelism_needs_scaled_dot_product_attention() -> None:
    from accel_core.transforms.context_parallel import check_model, uses_sdpa

    class Attention(nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    assert uses_sdpa(nn.Sequential(Attention()))
    with pytest.raises(ValueError, match=r"never calls torch\.nn\.functional\.scaled_dot_product_attention"):
        check_model(nn.Sequential(nn.Linear(2, 2)), 2)


class Scale(nn.Module):
    """Holds a parameter and has no reset_parameters: nothing could give it a value after meta init."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_meta_device_models_are_initialised_or_refused_by_name() -> None:
    from accel_core import Accelerator

    accelerator = Accelerator(cpu=True)
    with accelerator.precision.module_init_context(empty_init=True):
        plain = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        refused = nn.Sequential(nn.Linear(4, 4), Scale())
    assert plain[0].weight.is_meta and refused[1].weight.is_meta
    prepared = accelerator.prepare(plain)
    assert not prepared[0].weight.is_meta and torch.equal(prepared[1].weight, torch.ones(4))  # reset_parameters ran
    with pytest.raises(ValueError, match=r"have no reset_parameters\(\).*1 \(Scale\)"):
        accelerator.prepare(refused)

    class WithInitWeights(nn.Sequential):
        def init_weights(self) -> None:
            nn.init.zeros_(self[0].weight)
            nn.init.zeros_(self[0].bias)
            nn.init.constant_(self[1].weight, 2.0)

    with accelerator.precision.module_init_context(empty_init=True):
        hooked = WithInitWeights(nn.Linear(4, 4), Scale())
    hooked = accelerator.prepare(hooked)
    assert torch.equal(hooked[1].weight, torch.full((4,), 2.0)) and not hooked[0].weight.any()


def test_precision_objects_give_fsdp_its_policy() -> None:
    from accel_core.precision.modes import AutocastPrecision, Precision

    assert Precision().mixed_precision_policy().param_dtype is None
    policy = AutocastPrecision("bf16", "cpu").mixed_precision_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    model = nn.Linear(2, 2)
    assert Precision().convert_module(model) is model


def test_blocks_are_checkpointed_then_compiled_in_place() -> None:
    from accel_core import Accelerator

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tanh(self.fc(x))

    class Net(nn.Sequential):
        _no_split_modules: ClassVar[list[str]] = ["Block"]

    torch.manual_seed(0)
    plain = Net(Block(), Block())
    reference = Net(Block(), Block())
    reference.load_state_dict(plain.state_dict())
    accelerator = Accelerator(
        cpu=True, dynamo_backend="eager", parallelism_config=ParallelismConfig(activation_checkpointing=True)
    )
    model = accelerator.prepare(plain)
    assert model is plain and not hasattr(model, "_orig_mod")  # the blocks are compiled, not the whole model
    assert all(block._compiled_call_impl is not None for block in model)
    from torch.distributed._composable.contract import _get_registry

    assert all("checkpoint" in (_get_registry(block) or {}) for block in model)
    x = torch.randn(3, 4)
    model(x).sum().backward()
    reference(x).sum().backward()
    assert torch.allclose(model[0].fc.weight.grad, reference[0].fc.weight.grad, atol=1e-6)
    with pytest.raises(ValueError, match="needs the blocks"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(activation_checkpointing=True)).prepare(
            nn.Linear(2, 2)
        )


def test_sequence_parallel_fields_have_accelerates_defaults() -> None:
    """transformers' Trainer and TRL read sp_enabled / sp_size / sp_backend / cp_backend on every step's inputs."""
    config = ParallelismConfig()
    assert (config.cp_backend, config.sp_size, config.sp_backend, config.sp_enabled) == ("torch", 1, "deepspeed", False)
    assert ParallelismConfig(cp_size=2, cp_backend="torch").cp_enabled


def test_sequence_parallelism_accel_cannot_run_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Ulysses .* cp_size=2"):
        ParallelismConfig(sp_size=2)
    with pytest.raises(ValueError, match="sp_backend must be one of"):
        ParallelismConfig(sp_backend="ring")
    with pytest.raises(ValueError, match="cp_backend must be one of"):
        ParallelismConfig(cp_backend="deepspeed")
    with pytest.raises(ValueError, match="sp_size must be an integer"):
        ParallelismConfig(sp_size=0)
