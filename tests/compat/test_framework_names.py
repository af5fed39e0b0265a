"""Names transformers, TRL, PEFT and diffusers import from Accelerate's submodules, and what they do under accel."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn


def test_memory_helpers_of_accelerate_utils_memory() -> None:
    from accel.utils.memory import clear_device_cache, should_reduce_batch_size

    assert should_reduce_batch_size(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert should_reduce_batch_size(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert not should_reduce_batch_size(RuntimeError("shape mismatch"))
    assert not should_reduce_batch_size(ValueError(" out of memory."))
    clear_device_cache(garbage_collection=True)  # runs on any machine (empty_cache of the device there is)


def test_clean_device_map_groups_submodules_on_one_device() -> None:
    from accel.utils.modeling import clean_device_map

    device_map = {"a.0": 0, "a.1": 0, "b.x": "cpu", "b.y": 1}
    assert clean_device_map(device_map) == {"a": 0, "b.x": "cpu", "b.y": 1}
    assert clean_device_map({"a.0": "cpu", "b": "cpu"}) == {"": "cpu"}


def test_big_modeling_module_has_check_device_map() -> None:
    """transformers swaps ``accelerate.big_modeling.check_device_map`` out for a no-op while it dispatches."""
    import accel.big_modeling
    from accel.utils import check_device_map

    assert accel.big_modeling.check_device_map is check_device_map
    with pytest.raises(ValueError, match="weight"):
        check_device_map(nn.Linear(2, 2), {"bias": "cpu"})


def test_custom_dtype_sizes_weights_for_device_maps() -> None:
    from accel.utils import CustomDtype, compute_module_sizes, dtype_byte_size

    assert [m.value for m in CustomDtype] == ["fp8", "int4", "int2"]
    assert dtype_byte_size(CustomDtype.INT4) == 0.5 and dtype_byte_size(CustomDtype.INT2) == 0.25
    layer = nn.Linear(8, 8, bias=False)  # 64 fp32 weights
    assert compute_module_sizes(layer)[""] == 256
    assert compute_module_sizes(layer, special_dtypes={"weight": CustomDtype.INT4})[""] == 32
    assert compute_module_sizes(layer, dtype=CustomDtype.FP8)[""] == 64


def test_load_offloaded_weights_reads_an_offload_folder_into_the_model(tmp_path) -> None:
    from accel.utils import load_offloaded_weights, offload_weight, save_offload_index

    source = nn.Linear(3, 2)
    index: dict = {}
    for name, tensor in source.state_dict().items():
        offload_weight(tensor, name, tmp_path, index=index)
    save_offload_index(index, tmp_path)
    with torch.device("meta"):
        target = nn.Linear(3, 2)
    load_offloaded_weights(target, index, tmp_path)
    assert target.weight.device.type == "cpu"
    torch.testing.assert_close(target.state_dict(), source.state_dict())
    load_offloaded_weights(target, {}, tmp_path)  # nothing to load: nothing happens


def test_fsdp_constants_are_accelerates_lists_and_the_plugin_takes_them() -> None:
    from accel.utils import FullyShardedDataParallelPlugin
    from accel.utils.constants import FSDP_AUTO_WRAP_POLICY, FSDP_SHARDING_STRATEGY

    assert FSDP_AUTO_WRAP_POLICY[0] == "TRANSFORMER_BASED_WRAP" and "NO_WRAP" in FSDP_AUTO_WRAP_POLICY
    assert FSDP_SHARDING_STRATEGY == ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
    for policy in FSDP_AUTO_WRAP_POLICY:
        kwargs = {"transformer_cls_names_to_wrap": "Block"} if policy == "TRANSFORMER_BASED_WRAP" else {}
        assert FullyShardedDataParallelPlugin(auto_wrap_policy=policy, **kwargs).auto_wrap_policy == policy
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        plugin = FullyShardedDataParallelPlugin(sharding_strategy=strategy)
        assert plugin.sharding_strategy.lstrip("_") == strategy


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)


def test_get_module_class_from_name_finds_a_nested_class() -> None:
    from accel.utils import FullyShardedDataParallelPlugin
    from accel.utils.dataclasses import get_module_class_from_name

    model = nn.Sequential(nn.ReLU(), nn.Sequential(Block()))
    assert get_module_class_from_name(model, "Block") is Block
    assert get_module_class_from_name(model, "Linear") is nn.Linear
    assert get_module_class_from_name(model, "Missing") is None
    assert FullyShardedDataParallelPlugin.get_module_class_from_name(model, "Block") is Block


def test_get_parameters_from_modules_by_regex_or_modules() -> None:
    from accel.utils.fsdp_utils import get_parameters_from_modules

    model = nn.Sequential(Block(), Block())
    found = get_parameters_from_modules(r"1\.inner", model, "cpu")
    assert found == set(model[1].inner.parameters())
    assert get_parameters_from_modules([model[0]], model, "cpu") == set(model[0].parameters())
    assert get_parameters_from_modules(None, model, "cpu") == set()
    moved = get_parameters_from_modules(r"0\.inner", model, "meta")  # found by name: moved to the device
    assert {p.device.type for p in moved} == {"meta"} and model[0].inner.weight.device.type == "meta"


def test_commands_config_reads_the_launch_config(tmp_path, monkeypatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("num_processes: 2\nmixed_precision: bf16\n")
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(config))
    code = (
        "from accel.commands.config import default_config_file, load_config_from_file\n"
        "print(default_config_file); d = load_config_from_file(None).to_dict()\n"
        "print(d['num_processes'], d['mixed_precision'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(config), "2", "bf16"]
    from accel.commands.config import load_config_from_file

    with pytest.raises(FileNotFoundError, match="accel config"):
        load_config_from_file(str(tmp_path / "missing.yaml"))


def test_commands_launch_parser_and_command_run_a_script(tmp_path) -> None:
    """TRL's CLI: ``launch_command(launch_command_parser().parse_args(flags + [script] + args))``."""
    from accel.commands.launch import launch_command, launch_command_parser

    marker = tmp_path / "ran.txt"
    script = tmp_path / "train.py"
    script.write_text("import os, sys\nopen(sys.argv[1], 'w').write(os.environ.get('ACCEL_MIXED_PRECISION', ''))\n")
    args = launch_command_parser().parse_args(["--mixed_precision", "no", str(script), str(marker)])
    assert args.script == str(script) and args.script_args == [str(marker)]
    launch_command(args)
    assert marker.read_text() == "no"
    failing = tmp_path / "fail.py"
    failing.write_text("raise SystemExit(3)\n")
    with pytest.raises(subprocess.CalledProcessError) as failure:
        launch_command(launch_command_parser().parse_args([str(failing)]))
    assert failure.value.returncode == 3
    with pytest.raises(ValueError, match="script to run is missing"):
        launch_command(launch_command_parser().parse_args([]))
