"""accel-fsdp without processes: the plugin, its environment variables, the launcher flags and config
file path to them, and the choice of FSDP units. Fast; no process group is created here."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import ClassVar

import pytest
import torch
from torch import nn

from accel_fsdp import FSDPStrategy, FullyShardedDataParallelPlugin
from accel_fsdp.cli import FSDPLaunchOptions
from accel_fsdp.policies import fsdp1_mixed_precision, fsdp2_mixed_precision, ignored_modules, units_to_wrap


def test_defaults_and_normalisation():
    plugin = FullyShardedDataParallelPlugin()
    assert (plugin.fsdp_version, plugin.sharding_strategy, plugin.auto_wrap_policy, plugin.state_dict_type) == (
        2,
        "FULL_SHARD",
        "NO_WRAP",
        "SHARDED_STATE_DICT",
    )
    plugin = FullyShardedDataParallelPlugin(
        sharding_strategy=2,
        transformer_cls_names_to_wrap="Block, Attention",
        state_dict_type="full_state_dict",
        backward_prefetch="backward_post",
    )
    assert plugin.sharding_strategy == "SHARD_GRAD_OP"
    assert plugin.transformer_cls_names_to_wrap == ["Block", "Attention"]
    assert plugin.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"  # implied by the class names
    assert (plugin.state_dict_type, plugin.backward_prefetch) == ("FULL_STATE_DICT", "BACKWARD_POST")
    from torch.distributed.fsdp import ShardingStrategy

    assert (
        FullyShardedDataParallelPlugin(sharding_strategy=ShardingStrategy.HYBRID_SHARD).sharding_strategy
        == "HYBRID_SHARD"
    )
    assert FullyShardedDataParallelPlugin(fsdp_version=1, cpu_ram_efficient_loading=True).sync_module_states
    plugin.set_state_dict_type("sharded_state_dict")  # Accelerate's method, used by existing scripts
    assert plugin.state_dict_type == "SHARDED_STATE_DICT"
    with pytest.raises(ValueError, match="FULL_STATE_DICT"):
        plugin.set_state_dict_type("LOCAL_STATE_DICT")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fsdp_version": 3}, "fsdp_version must be 1 or 2"),
        ({"sharding_strategy": "EVERYTHING"}, "FULL_SHARD"),
        ({"sharding_strategy": "NO_SHARD"}, "DDP strategy"),
        ({"auto_wrap_policy": "by_magic"}, "TRANSFORMER_BASED_WRAP"),
        ({"ignored_modules": "(unclosed"}, "regular expression"),
        ({"min_num_params": -1}, "non-negative"),
    ],
)
def test_invalid_plugins_say_how_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        FullyShardedDataParallelPlugin(**kwargs)


def test_from_env_reads_accelerate_style_options():
    environ = {
        "ACCEL_FSDP_VERSION": "1",
        "ACCEL_FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
        "ACCEL_FSDP_OFFLOAD_PARAMS": "true",
        "ACCEL_FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP",
        "ACCEL_FSDP_MIN_NUM_PARAMS": "1e6",
        "ACCEL_FSDP_BACKWARD_PREFETCH": "NO_PREFETCH",
        "ACCEL_FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
        "ACCEL_FSDP_USE_ORIG_PARAMS": "false",
        "ACCEL_FSDP_ACTIVATION_CHECKPOINTING": "yes",
        "ACCEL_FSDP_MIXED_PRECISION": '{"param_dtype": "bf16", "reduce_dtype": "fp32"}',
        "ACCEL_FSDP_IGNORED_MODULES": "head",
        "ACCEL_OTHER_THING": "not ours",
    }
    plugin = FullyShardedDataParallelPlugin.from_env(environ)
    assert plugin.fsdp_version == 1 and plugin.sharding_strategy == "SHARD_GRAD_OP" and plugin.offload_params
    assert plugin.auto_wrap_policy == "SIZE_BASED_WRAP" and plugin.min_num_params == 1_000_000
    assert plugin.backward_prefetch == "NO_PREFETCH" and plugin.state_dict_type == "FULL_STATE_DICT"
    assert plugin.use_orig_params is False and plugin.activation_checkpointing is True
    assert plugin.mixed_precision_policy == {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    assert plugin.ignored_modules == "head"
    assert FullyShardedDataParallelPlugin.from_env({}) == FullyShardedDataParallelPlugin()


def test_from_env_errors_name_the_variable():
    with pytest.raises(ValueError, match="ACCEL_FSDP_OFFLOAD_PARAMS"):
        FullyShardedDataParallelPlugin.from_env({"ACCEL_FSDP_OFFLOAD_PARAMS": "maybe"})
    with pytest.raises(ValueError, match=r"ACCEL_FSDP_SHARDNG_STRATEGY.*Known:.*ACCEL_FSDP_SHARDING_STRATEGY"):
        FullyShardedDataParallelPlugin.from_env({"ACCEL_FSDP_SHARDNG_STRATEGY": "FULL_SHARD"})
    with pytest.raises(ValueError, match=r"invalid FSDP setup.*NO_SHARD"):
        FullyShardedDataParallelPlugin.from_env({"ACCEL_FSDP_SHARDING_STRATEGY": "NO_SHARD"})


def test_to_env_round_trip():
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=1,
        sharding_strategy="HYBRID_SHARD",
        cpu_offload=True,
        transformer_cls_names_to_wrap=["Block"],
        activation_checkpointing=True,
        reshard_after_forward=False,
        forward_methods=("generate", "sample"),
    )
    assert FullyShardedDataParallelPlugin.from_env(plugin.to_env()) == plugin
    assert FullyShardedDataParallelPlugin().to_env() == {}


def test_config_file_and_launch_flags_reach_the_plugin():
    """accel launch: a config file's fsdp section (or Accelerate's fsdp_config) and --fsdp-* flags become
    ACCEL_FSDP_* variables, from which the workers build the same plugin."""
    from accel_launch import convert_accelerate_config, resolve_plan

    accelerate = {
        "distributed_type": "FSDP",
        "num_processes": 2,
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_sharding_strategy": "SHARD_GRAD_OP",
            "fsdp_transformer_layer_cls_to_wrap": "Block",
            "fsdp_state_dict_type": "FULL_STATE_DICT",
            "fsdp_offload_params": False,
            "fsdp_reshard_after_forward": False,
        },
    }
    config, warnings = convert_accelerate_config(accelerate)
    assert warnings == []
    plan = resolve_plan({}, {}, config)
    assert plan.env["ACCEL_STRATEGY"] == "fsdp"
    plugin = FullyShardedDataParallelPlugin.from_env(plan.env)
    assert (plugin.sharding_strategy, plugin.transformer_cls_names_to_wrap, plugin.state_dict_type) == (
        "SHARD_GRAD_OP",
        ["Block"],
        "FULL_STATE_DICT",
    )
    assert plugin.reshard_after_forward is False and not plugin.offload_params

    options = FSDPLaunchOptions()
    parser = argparse.ArgumentParser()
    options.add_arguments(parser.add_argument_group("fsdp options"))
    namespace = parser.parse_args(
        ["--fsdp-version", "1", "--fsdp-offload-params", "YES", "--fsdp-sharding-strategy", "hybrid_shard"]
    )
    flag_env = options.to_env(namespace)
    assert flag_env == {
        "ACCEL_FSDP_VERSION": "1",
        "ACCEL_FSDP_OFFLOAD_PARAMS": "true",
        "ACCEL_FSDP_SHARDING_STRATEGY": "HYBRID_SHARD",
        "ACCEL_STRATEGY": "fsdp",
    }
    plan = resolve_plan({}, {}, config, flag_env=flag_env)  # flags win over the config file
    plugin = FullyShardedDataParallelPlugin.from_env(plan.env)
    assert (plugin.fsdp_version, plugin.sharding_strategy, plugin.offload_params) == (1, "HYBRID_SHARD", True)
    assert options.to_env(parser.parse_args([])) == {}
    assert options.to_env(parser.parse_args(["--use-fsdp"])) == {"ACCEL_STRATEGY": "fsdp"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--fsdp-state-dict-type", "LOCAL"])


def test_cli_and_plugin_do_not_import_torch():
    code = (
        "import sys, accel_fsdp, accel_fsdp.cli, accel_fsdp.plugin; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_selected_through_core():
    from accel_core.strategies import create_strategy, resolve_strategy_plan

    plugin = FullyShardedDataParallelPlugin(fsdp_version=1)
    plan = resolve_strategy_plan(world_size=2, plugins={"fsdp_plugin": plugin})
    assert plan.strategy == "fsdp"
    strategy = create_strategy(plan.strategy, plan.strategy_plugin, {})
    assert isinstance(strategy, FSDPStrategy) and strategy.plugin is plugin
    assert resolve_strategy_plan(world_size=2, environ={"ACCEL_STRATEGY": "fsdp"}).strategy == "fsdp"
    with pytest.raises(TypeError, match="FullyShardedDataParallelPlugin"):
        create_strategy("fsdp", {"sharding_strategy": "FULL_SHARD"}, {})


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)


class Net(nn.Module):
    _no_split_modules: ClassVar[list[str]] = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 4)


def test_units_to_wrap():
    net = Net()
    names = {id(m): n for n, m in net.named_modules()}

    def chosen(**kwargs):
        plugin = FullyShardedDataParallelPlugin(**kwargs)
        return [names[id(m)] for m in units_to_wrap(net, plugin, ignored_modules(net, plugin.ignored_modules))]

    assert chosen() == []
    blocks = ["blocks.0", "blocks.1", "blocks.2"]
    assert chosen(transformer_cls_names_to_wrap=["Block"]) == blocks
    assert chosen(auto_wrap_policy="transformer_based_wrap") == blocks  # the model's _no_split_modules
    # Size: a block holds 1104 parameters; below that its linears go first (children before parents).
    assert chosen(auto_wrap_policy="size_based_wrap", min_num_params=1000) == blocks
    assert chosen(auto_wrap_policy="size_based_wrap", min_num_params=500) == [
        f"blocks.{i}.{f}" for i in range(3) for f in ("fc1", "fc2")
    ]
    import functools

    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.LayerNorm))
    assert chosen(auto_wrap_policy=policy) == [f"blocks.{i}.norm" for i in range(3)]
    assert chosen(transformer_cls_names_to_wrap=["Block"], ignored_modules=r"blocks\.1") == ["blocks.0", "blocks.2"]
    with pytest.raises(ValueError, match=r"Could not find the transformer layer class.*Missing"):
        chosen(transformer_cls_names_to_wrap=["Missing"])
    with pytest.raises(ValueError, match="matches no module"):
        chosen(ignored_modules="nothing_like_this")


def test_units_replaced_after_they_were_chosen_are_refused():
    # parallelize_fsdp2 chooses the units on the model as built; a tensor-parallel step that swaps a block for a new
    # object would leave FSDP2 sharding (and checkpointing) an orphan, silently. Refused before anything is sharded.
    from accel_fsdp.fsdp2 import shard_model

    net = Net()
    plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"])
    units = units_to_wrap(net, plugin, [])
    net.blocks[1] = Block()
    with pytest.raises(ValueError, match=r"no longer modules of Net.*parallelize_fn"):
        shard_model(net, plugin, units=units, ignored=[], mesh=None, device=torch.device("cpu"), precision=None)


def test_mixed_precision_policies():
    assert fsdp2_mixed_precision(None, "no").param_dtype is None
    policy = fsdp2_mixed_precision(None, "bf16")
    assert (policy.param_dtype, policy.reduce_dtype) == (
        torch.bfloat16,
        torch.float32,
    )  # fp32 master shards and reductions
    policy = fsdp2_mixed_precision({"param_dtype": "fp16", "output_dtype": "float32"}, "no")
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.float16, None, torch.float32)
    assert fsdp2_mixed_precision("bfloat16", "no").param_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="buffer_dtype"):
        fsdp2_mixed_precision({"buffer_dtype": "bf16"}, "no")
    with pytest.raises(ValueError, match="not a dtype"):
        fsdp2_mixed_precision({"param_dtype": "int3"}, "no")
    assert fsdp1_mixed_precision(None, "no") is None
    v1 = fsdp1_mixed_precision({"param_dtype": "bf16", "buffer_dtype": "bf16"}, "fp16")
    assert (v1.param_dtype, v1.buffer_dtype, v1.reduce_dtype) == (torch.bfloat16, torch.bfloat16, None)


def test_state_dict_configs_as_accelerate_takes_them():
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, ShardedStateDictConfig

    plugin = FullyShardedDataParallelPlugin(
        state_dict_type="FULL_STATE_DICT",
        state_dict_config=FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True),
    )
    assert plugin.state_dict_config.rank0_only and plugin.optim_state_dict_config.offload_to_cpu
    assert FullyShardedDataParallelPlugin().state_dict_config is None  # implied by state_dict_type
    assert FullyShardedDataParallelPlugin(state_dict_config={"offload_to_cpu": False}).state_dict_config == {
        "offload_to_cpu": False
    }
    with pytest.raises(ValueError, match="does not match state_dict_type=SHARDED_STATE_DICT"):
        FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT", state_dict_config=FullStateDictConfig())
    # Without a type (Accelerate's fsdp_with_peak_mem_tracking example): the configs' kind, else sharded.
    inferred = FullyShardedDataParallelPlugin(
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=False),
    )
    assert inferred.state_dict_type == "FULL_STATE_DICT"
    assert FullyShardedDataParallelPlugin().state_dict_type == "SHARDED_STATE_DICT"
    assert (
        FullyShardedDataParallelPlugin(state_dict_config=ShardedStateDictConfig()).state_dict_type
        == "SHARDED_STATE_DICT"
    )
    with pytest.raises(ValueError, match="different kinds"):
        FullyShardedDataParallelPlugin(
            state_dict_config=FullStateDictConfig(), optim_state_dict_config=ShardedStateDictConfig()
        )
    with pytest.raises(ValueError, match="unknown keys"):
        FullyShardedDataParallelPlugin(optim_state_dict_config={"offload": True})
    with pytest.raises(TypeError, match="state dict config or a dict"):
        FullyShardedDataParallelPlugin(state_dict_config=3)
    # Switching the type for a final full save drops configs of the other kind.
    sharded = FullyShardedDataParallelPlugin(state_dict_config=ShardedStateDictConfig(offload_to_cpu=True))
    sharded.set_state_dict_type("FULL_STATE_DICT")
    assert sharded.state_dict_type == "FULL_STATE_DICT" and sharded.state_dict_config is None
    assert "STATE_DICT_CONFIG" not in " ".join(plugin.to_env())  # torch objects do not travel through the environment
