"""The xla strategy's parts that need no XLA device: launch flags and config section, version checks, selection,
the layout and precision refusals, SPMD layouts and partition specs, and core's dispatch to a backend's
collectives. Run in every environment."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import accel_core
from accel.commands import env as env_command
from accel.commands.common import plan_from_namespace
from accel.commands.launch import build_parser
from accel_core import ops
from accel_core.parallel.config import ParallelismConfig
from accel_core.placement import ProcessPlacement
from accel_core.precision.modes import PrecisionContext
from accel_core.settings import settle
from accel_core.state import PartialState
from accel_core.strategies import resolve_strategy_plan
from accel_launch.extensions import load_extensions
from accel_xla import XlaLaunchOptions, XlaStrategy
from accel_xla.collectives import pack_object, unpack_objects, xla_reduce_type
from accel_xla.spmd import fsdp_spec, partition_specs, process_layout, resolve_spmd_layout, spmd_requested
from accel_xla.versions import check_versions, release

from .conftest import HAS_TORCH_XLA

VERSION = re.escape(accel_core.__version__)  # the hints pin accel's own release


def launch_env(argv: list[str], tmp_path: Path, config: str = "") -> dict[str, str]:
    """The variables ``accel launch`` would give the workers for ``argv`` (and a config file's text)."""
    config_file = tmp_path / "accel.yaml"
    config_file.write_text(config or "{}\n")
    extensions = load_extensions()
    assert any(isinstance(e, XlaLaunchOptions) for e in extensions), "accel-xla's accel.cli entry point is missing"
    namespace = build_parser(extensions).parse_args(["--config-file", str(config_file), *argv, "train.py"])
    return plan_from_namespace(namespace, extensions).env


def test_launch_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PJRT_DEVICE", "ACCEL_STRATEGY", "XLA_DOWNCAST_BF16"):
        monkeypatch.delenv(name, raising=False)
    assert launch_env(["--tpu"], tmp_path)["ACCEL_STRATEGY"] == "xla"
    assert launch_env(["--use-xla"], tmp_path)["ACCEL_STRATEGY"] == "xla"
    env = launch_env(["--xla-device", "tpu", "--mixed-precision", "bf16", "--downcast_bf16"], tmp_path)
    assert env["ACCEL_STRATEGY"] == "xla" and env["PJRT_DEVICE"] == "TPU" and env["ACCEL_XLA_DEVICE"] == "TPU"
    assert env["ACCEL_XLA_DOWNCAST_BF16"] == "true" and env["XLA_DOWNCAST_BF16"] == "1"
    assert "ACCEL_STRATEGY" not in launch_env([], tmp_path)


def test_config_file_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEL_STRATEGY", raising=False)
    env = launch_env([], tmp_path, "strategy: xla\nxla:\n  device: TPU\n  downcast_bf16: true\n")
    assert env["ACCEL_STRATEGY"] == "xla"
    assert env["ACCEL_XLA_DEVICE"] == "TPU" and env["ACCEL_XLA_DOWNCAST_BF16"] == "true"


def test_xla_is_chosen_when_an_xla_device_is_configured_and_torch_xla_installed() -> None:
    # In the main environment (no torch-xla) a stray PJRT_DEVICE must not select a strategy that cannot run.
    expected = "xla" if importlib.util.find_spec("torch_xla") is not None else "single_device"
    assert resolve_strategy_plan(world_size=1, environ={"PJRT_DEVICE": "TPU"}).strategy == expected
    assert resolve_strategy_plan(world_size=4, environ={"PJRT_DEVICE": "TPU"}).strategy == (
        "xla" if expected == "xla" else "ddp"
    )
    chosen = resolve_strategy_plan(world_size=1, environ={"PJRT_DEVICE": "TPU", "ACCEL_USE_CPU": "true"}).strategy
    assert chosen != "xla"
    assert resolve_strategy_plan(world_size=1, environ={}).strategy == "single_device"
    chosen = resolve_strategy_plan(world_size=2, environ={"PJRT_DEVICE": "TPU", "ACCEL_STRATEGY": "ddp"}).strategy
    assert chosen == "ddp"


def test_torch_and_torch_xla_releases_must_match() -> None:
    assert release("2.9.0+cu128") == (2, 9)
    check_versions("2.9.0+cpu", "2.9.0")
    check_versions("2.9.1", "2.9.0")
    with pytest.raises(ImportError, match=r"torch-xla 2\.9\.0 runs only with torch 2\.9.*pip install torch==2\.9"):
        check_versions("2.14.1", "2.9.0")


@pytest.mark.skipif(HAS_TORCH_XLA, reason="torch-xla is installed here")
def test_missing_torch_xla_names_the_install_command() -> None:
    with pytest.raises(ImportError, match=rf'pip install "accel\[xla\]=={VERSION}"'):
        XlaStrategy().init_process_group()


def test_layout_and_precision_refusals() -> None:
    strategy = XlaStrategy(downcast_bf16=False)
    two_processes = settle({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"})
    strategy.check_parallelism(ParallelismConfig(dp_replicate_size=4))
    for sizes in ({"tp_size": 2}, {"dp_shard_size": 2}, {"cp_size": 2}):
        with pytest.raises(ValueError, match="over processes the xla strategy runs replicas only"):
            strategy.check_parallelism(ParallelismConfig(**sizes))
    # cp / pp never reach SPMD: refused before the runtime starts.
    for sizes in ({"cp_size": 2}, {"pp_size": 2}):
        with pytest.raises(ValueError, match="cp / pp are not available"):
            strategy.parallelism(ParallelismConfig(**sizes), two_processes)
    # SPMD is one process driving every device: refused for several, before the runtime starts.
    with pytest.raises(ValueError, match="one process driving every device, but 2 processes"):
        strategy.parallelism(ParallelismConfig(dp_shard_size=2), two_processes)
    cpu = PrecisionContext(torch.device("cpu"))
    assert strategy.make_precision("no", cpu).name == "no"
    downcasting = XlaStrategy(downcast_bf16=True)
    assert downcasting.make_precision("bf16", cpu).name == "bf16"
    with pytest.raises(ValueError, match=r"Can only use `downcast_bf16` when using `mixed_precision='bf16'`"):
        downcasting.make_precision("no", cpu)
    assert "fp16" not in XlaStrategy.supported_precisions
    with pytest.raises(TypeError, match="takes no plugin"):
        XlaStrategy.from_plugin(object(), {}, settle({}))


def test_reductions_and_object_payloads() -> None:
    assert [xla_reduce_type(r) for r in ("sum", "max", "min", "product")] == ["sum", "max", "min", "mul"]
    with pytest.raises(ValueError, match="Unknown reduction"):
        xla_reduce_type("mean")
    payloads = [pack_object({"rank": r}) for r in range(3)]
    assert unpack_objects(payloads, None) == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    assert unpack_objects([], "mine") == ["mine"]  # one replica: the rendezvous exchanged nothing


class TwoReplicas:
    """A backend's collectives as two replicas would answer them, the other replica holding ``other``'s values:
    checks what accel_core.ops does with a placement's collectives (the XLA ones need a TPU for two replicas)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append("all_gather")
        return torch.cat([tensor, tensor + 10])

    def all_reduce(self, tensor: torch.Tensor, reduction: str) -> torch.Tensor:
        self.calls.append(f"all_reduce:{reduction}")
        return tensor + (tensor + 10)

    def broadcast(self, tensor: torch.Tensor, from_process: int) -> torch.Tensor:
        self.calls.append(f"broadcast:{from_process}")
        return tensor + 10 if from_process == 1 else tensor

    def gather_object(self, obj: Any) -> list[Any]:
        self.calls.append("gather_object")
        return [obj, obj]

    def broadcast_object(self, obj: Any, from_process: int) -> Any:
        self.calls.append(f"broadcast_object:{from_process}")
        return obj

    def barrier(self, tag: str) -> None:
        self.calls.append(f"barrier:{tag}")


def test_core_operations_go_through_a_placements_collectives() -> None:
    collectives = TwoReplicas()
    placement = ProcessPlacement(torch.device("cpu"), 2, 0, 0, 2, backend="fake", collectives=collectives)
    state = PartialState(placement=placement)
    assert (state.num_processes, state.process_index, state.backend) == (2, 0, "fake")
    assert state.collectives is collectives
    assert ops.gather(torch.tensor(1.0)).tolist() == [1.0, 11.0]
    assert ops.reduce(torch.tensor([1.0]), reduction="mean").tolist() == [6.0]  # (1 + 11) / 2
    assert ops.reduce(torch.tensor([1.0]), reduction="sum", scale=2.0).tolist() == [24.0]
    assert ops.broadcast(torch.tensor([1.0]), from_process=1).tolist() == [11.0]
    assert ops.gather_object(["a"]) == ["a", "a"]
    assert ops.broadcast_object_list([3], from_process=1) == [3]
    # Padding asks every replica's size through the same gather: the other replica's is 10 longer here.
    assert ops.pad_across_processes(torch.ones(2), dim=0).shape == (12,)
    state.wait_for_everyone()
    assert collectives.calls == [
        "all_gather",
        "all_reduce:sum",
        "all_reduce:sum",
        "broadcast:1",
        "gather_object",
        "broadcast_object:1",
        "all_gather",
        "barrier:accel.wait_for_everyone",
    ]


def test_placement_is_checked() -> None:
    with pytest.raises(ValueError, match="rank 2 is not within world_size 2"):
        ProcessPlacement(torch.device("cpu"), 2, 2, 0, 1)


def test_env_report_shows_the_xla_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    line = env_command.xla_runtime(os.environ)
    if HAS_TORCH_XLA:
        assert line.startswith("torch-xla ") and "PJRT_DEVICE=TPU" in line
    else:
        assert line == "torch-xla not installed"
    assert f"- XLA runtime: {line}" in env_command.report()


def test_spmd_layout_is_resolved_against_the_devices() -> None:
    no_env: dict[str, str] = {}
    assert not spmd_requested(ParallelismConfig(dp_replicate_size=4), no_env)
    assert spmd_requested(ParallelismConfig(tp_size=2), no_env)
    assert spmd_requested(None, {"ACCEL_DP_SHARD_SIZE": "4"})  # accel launch --dp-shard-size 4
    assert resolve_spmd_layout(ParallelismConfig(tp_size=2), 8, environ=no_env).sizes == {
        "pp": 1,
        "dp_replicate": 1,
        "dp_shard": 4,
        "cp": 1,
        "tp": 2,
    }
    assert resolve_spmd_layout(None, 4, environ={"ACCEL_DP_SHARD_SIZE": "4"}).size("dp_shard") == 4
    with pytest.raises(ValueError, match="dp_shard_size=2 x tp_size=1 = 2, but this process drives 4 XLA devices"):
        resolve_spmd_layout(ParallelismConfig(dp_shard_size=2), 4, environ=no_env)
    with pytest.raises(ValueError, match="tp_size=3 must divide the 4 XLA devices"):
        resolve_spmd_layout(ParallelismConfig(tp_size=3), 4, environ=no_env)
    for sizes in ({"dp_replicate_size": 2, "dp_shard_size": 2}, {"cp_size": 2, "tp_size": 2}):
        with pytest.raises(ValueError, match="covers dp_shard and tp only"):
            resolve_spmd_layout(ParallelismConfig(**sizes), 4, environ=no_env)
    with pytest.raises(ValueError, match="Multi-host SPMD is not built"):
        resolve_spmd_layout(ParallelismConfig(dp_shard_size=4), 4, process_count=2, environ=no_env)
    plan = {"0": "colwise"}
    seen = process_layout(ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan=plan))
    assert set(seen.sizes.values()) == {1} and seen.tp_plan == plan


def test_partition_specs_follow_fsdp_and_the_tensor_parallel_plan() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 16), torch.nn.Linear(16, 8, bias=False))
    fsdp_only = resolve_spmd_layout(ParallelismConfig(dp_shard_size=4), 4, environ={})
    assert partition_specs(model, fsdp_only) == {
        "0.weight": ("fsdp", None),
        "1.weight": ("fsdp", None),
        "1.bias": ("fsdp",),
        "2.weight": (None, "fsdp"),
    }
    assert fsdp_spec(()) == ()
    plan = {"0": "rowwise", "1": ColwiseParallel(), "2": "rowwise"}
    layout = resolve_spmd_layout(ParallelismConfig(tp_size=2, tp_plan=plan), 4, environ={})
    assert partition_specs(model, layout) == {
        "0.weight": ("tp", "fsdp"),  # the vocabulary over tp
        "1.weight": ("tp", "fsdp"),
        "1.bias": ("tp",),
        "2.weight": ("fsdp", "tp"),
    }

    def specs_for(plan: Any, tp: int = 2) -> Any:
        return partition_specs(model, resolve_spmd_layout(ParallelismConfig(tp_size=tp, tp_plan=plan), 4, environ={}))

    with pytest.raises(ValueError, match="GSPMD places the activations itself"):
        specs_for({"1": SequenceParallel()})
    with pytest.raises(ValueError, match="matches no submodule"):
        specs_for({"layers.*.q": "colwise"})
    with pytest.raises(ValueError, match=r"tp_size=4 must divide 0\.num_embeddings=10"):
        specs_for({"0": "rowwise"}, tp=4)
    with pytest.raises(ValueError, match=r"splits nn\.Linear and nn\.Embedding layers only"):
        nested = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2)))
        partition_specs(nested, ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan={"0": "colwise"}))
    with pytest.raises(ValueError, match="nothing says how to split"):
        specs_for(None)
    with pytest.raises(ValueError, match="does not run: describe the split with ParallelismConfig"):
        partition_specs(model, ParallelismConfig(tp_size=2, parallelize_fn=lambda m, mesh: m))


def test_launch_mesh_sizes_count_devices_under_xla(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --use-xla the mesh is laid over one process's devices (SPMD): accel launch leaves the sizes to the
    strategy instead of checking them against --num-processes, which it still does for every other strategy."""
    monkeypatch.delenv("ACCEL_STRATEGY", raising=False)
    env = launch_env(["--use-xla", "--dp-shard-size", "2", "--tp-size", "2"], tmp_path)
    assert env["ACCEL_DP_SHARD_SIZE"] == "2" and env["ACCEL_TP_SIZE"] == "2" and env["ACCEL_STRATEGY"] == "xla"
    with pytest.raises(ValueError, match="must divide 1, the number of processes"):
        launch_env(["--dp-shard-size", "2", "--tp-size", "2"], tmp_path)
    # The strategy chosen in the config file or the environment counts devices too.
    config = "strategy: xla\ndp_shard_size: 2\ntp_size: 2\n"
    env = launch_env([], tmp_path, config)
    assert env["ACCEL_STRATEGY"] == "xla" and env["ACCEL_MESH_OVER_DEVICES"] == "true" and env["ACCEL_TP_SIZE"] == "2"
    monkeypatch.setenv("ACCEL_STRATEGY", "xla")
    assert launch_env(["--dp-shard-size", "4"], tmp_path)["ACCEL_MESH_OVER_DEVICES"] == "true"
    monkeypatch.setenv("ACCEL_STRATEGY", "ddp")  # another strategy: still checked against the processes
    with pytest.raises(ValueError, match="must divide 1, the number of processes"):
        launch_env(["--dp-shard-size", "4"], tmp_path)


def test_set_seed_reaches_accel_xlas_seeder_through_its_entry_point() -> None:
    """accel-core's set_seed seeds XLA through accel-xla's ``accel.seeders`` entry point, found by set_seed itself,
    so a script that seeds before creating its Accelerator seeds XLA too (tests/xla/test_xla_device.py checks the
    draws); without torch-xla the seeder does nothing."""
    from accel_core.random import seeders
    from accel_xla.seeding import seed_xla

    assert seed_xla in seeders()
    if not HAS_TORCH_XLA:
        seed_xla(3)  # returns: importing torch_xla here would raise require_torch_xla's ImportError
