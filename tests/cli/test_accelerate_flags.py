"""Accelerate's launch lines under `accel launch`: every flag of `accelerate launch` is taken, as accel's own flag,
translated into what the workers read, accepted with a note that it is not needed, or refused with what to do
instead (accel_launch.accelerate_flags); never argparse's bare "unrecognized arguments"."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accel.commands.launch import build_parser
from accel.commands.launch import main as launch_main
from accel_launch.accelerate_flags import (
    ACCELERATE_FLAGS,
    BACKEND_FLAGS,
    NOT_NEEDED,
    REFUSED,
    TRANSLATED,
    RefusedFlagError,
    accelerate_flags_env,
)
from accel_launch.extensions import load_extensions

HERE = Path(__file__).resolve().parent
ACCELERATE_LAUNCH_FLAGS = [
    line for line in (HERE / "accelerate_launch_flags.txt").read_text().splitlines() if not line.startswith("#")
]


def test_every_accelerate_launch_flag_is_known_to_accel_launch() -> None:
    known = set(build_parser(load_extensions())._option_string_actions)
    assert len(ACCELERATE_LAUNCH_FLAGS) > 100
    assert [flag for flag in ACCELERATE_LAUNCH_FLAGS if flag not in known] == []


def test_a_backends_flags_without_its_package_name_the_package_to_install() -> None:
    # `accel` alone (the README's first install line): no backend package adds its flags. Each of Accelerate's flags
    # still parses, and a backend's stops the launch naming what to install (it was "unrecognized arguments").
    core_only = build_parser([])
    assert [flag for flag in ACCELERATE_LAUNCH_FLAGS if flag not in core_only._option_string_actions] == []
    namespace = core_only.parse_args(
        ["--use_fsdp", "--fsdp_sharding_strategy", "FULL_SHARD", "--zero_stage", "2", "train.py"]
    )
    with pytest.raises(RefusedFlagError) as refused:
        accelerate_flags_env(namespace)
    assert str(refused.value).splitlines() == [
        "Accelerate's flag(s) of a backend that is not installed:",
        "  --use_fsdp, --fsdp_sharding_strategy: the fsdp strategy's, whose package is not installed: "
        'pip install "accel[fsdp]==0.1.0"  (or pip install accel-fsdp).',
        "  --zero_stage: the deepspeed strategy's, whose package is not installed: "
        'pip install "accel[deepspeed]==0.1.0"  (or pip install accel-deepspeed).',
    ]
    # With the backends installed, each of those flags is the backend's own (the table names the right ones).
    installed = build_parser(load_extensions())._option_string_actions
    for flags in BACKEND_FLAGS.values():
        for flag in flags:
            assert flag in ACCELERATE_LAUNCH_FLAGS and not installed[flag].dest.startswith("accelerate_backend"), flag


def test_the_table_holds_only_accelerate_flags_each_with_its_outcome() -> None:
    for entry in ACCELERATE_FLAGS:
        assert entry.flag in ACCELERATE_LAUNCH_FLAGS, entry.flag
        assert entry.outcome in (NOT_NEEDED, REFUSED, TRANSLATED)
        assert (entry.to_env is not None) == (entry.outcome == TRANSLATED), entry.flag
        assert entry.outcome == TRANSLATED or entry.why, entry.flag


@pytest.fixture(autouse=True)
def _no_config_file(monkeypatch, tmp_path: Path) -> None:
    """No config file and no ACCEL_* variable of the caller's: the dry runs show only what the flags add."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in [name for name in os.environ if name.startswith("ACCEL_") or name == "OMP_NUM_THREADS"]:
        monkeypatch.delenv(name)


def _dry_run(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict[str, str], str]:
    """The variables a dry run adds to the workers' environment, and what it wrote on stderr."""
    assert launch_main(["--dry-run", "--cpu", *flags, "train.py"]) == 0
    out, err = capsys.readouterr()
    added = out.split("added to the environment:\n")[1].split("command:")[0]
    variables = dict(line.strip().split("=", 1) for line in added.splitlines() if "=" in line)
    return variables, err


def test_translated_flags_reach_the_workers_environment(capsys) -> None:
    variables, err = _dry_run(
        capsys,
        "--num_processes=2",
        "--num_cpu_threads_per_process", "3",
        "--gpu_ids", "0,1",
        "--dynamo_mode", "max-autotune",
        "--dynamo_use_fullgraph",
        "--fp8_backend", "ao",
        "--fp8_format", "e4m3",
        "--fp8_override_linear_precision", "false,false,true",
    )  # fmt: skip
    assert err == ""
    assert variables["OMP_NUM_THREADS"] == "3" and variables["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert variables["ACCEL_DYNAMO_MODE"] == "max-autotune" and variables["ACCEL_DYNAMO_USE_FULLGRAPH"] == "true"
    assert (variables["ACCEL_FP8_BACKEND"], variables["ACCEL_FP8_FORMAT"]) == ("AO", "E4M3")
    overrides = [variables[f"ACCEL_FP8_OVERRIDE_{gemm}"] for gemm in ("FPROP", "DGRAD", "WGRAD")]
    assert overrides == ["false", "false", "true"]


def test_megatron_lm_flags_are_the_megatron_strategys(capsys) -> None:
    variables, err = _dry_run(
        capsys,
        "-n",
        "4",
        "--use_megatron_lm",
        "--megatron_lm_tp_degree",
        "2",
        "--megatron_lm_context_parallel_size",
        "1",
    )
    assert variables["ACCEL_STRATEGY"] == "megatron" and variables["ACCEL_MEGATRON_TP_DEGREE"] == "2"
    # Accelerate's default value asks for nothing: accepted, with a note.
    assert "--megatron_lm_context_parallel_size 1: Accelerate's flag with its default value" in err


def test_flags_accel_does_not_need_are_accepted_with_one_note_each(capsys) -> None:
    _, err = _dry_run(capsys, "--multi_gpu", "-n", "2", "--same_network", "-q", "--main_training_function", "main")
    notes = err.splitlines()
    assert len(notes) == 4 and all(line.startswith("accel launch: --") for line in notes), err
    assert notes[0] == (
        "accel launch: --multi_gpu: Accelerate's flag, not needed: several processes are a data-parallel (DDP) job "
        "without it."
    )


def test_flags_accel_cannot_honour_stop_the_launch_saying_what_to_do(capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        launch_main(["--mpirun_hostfile", "hosts", "--megatron_lm_recompute_activations", "true", "train.py"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--mpirun_hostfile hosts: accel launch starts processes with torchrun's agent, not mpirun" in err
    assert "--megatron_lm_recompute_activations true: accel-megatron has no such setting" in err
    assert "unrecognized arguments" not in err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_an_accelerate_launch_line_trains_on_two_processes(cli) -> None:
    """`accelerate launch --multi_gpu ...` with only the command's name changed: the workers get what it asks."""
    result = cli.run(
        "launch", "--multi_gpu", "--cpu", "--num_processes", "2", "--num_cpu_threads_per_process", "2",
        "--mixed_precision", "bf16", "--dynamo_backend", "eager", "--dynamo_mode", "reduce-overhead",
        str(cli.scripts / "accelerate_line.py"),
    )  # fmt: skip
    assert result.returncode == 0, cli.describe(result)
    reports = sorted(
        (json.loads(line.split("REPORT ", 1)[1]) for line in result.stdout.splitlines() if "REPORT " in line),
        key=lambda report: report["rank"],
    )
    assert [report["rank"] for report in reports] == [0, 1], cli.describe(result)
    for report in reports:
        assert report["processes"] == 2 and report["distributed_type"].endswith("MULTI_CPU"), report
        assert report["mixed_precision"] == "bf16" and (report["omp"], report["threads"]) == ("2", 2), report
        assert report["compile"] == {"backend": "eager", "mode": "reduce-overhead"}, report
    assert "--multi_gpu: Accelerate's flag, not needed" in result.stderr


def test_an_accelerate_config_file_is_read_as_config_import_converts_it(capsys, tmp_path: Path) -> None:
    accelerate_file = tmp_path / "default_config.yaml"
    accelerate_file.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nmixed_precision: bf16\nnum_processes: 2\n"
        "gpu_ids: all\nsame_network: true\nipex_config:\n  ipex: true\n"
    )
    assert launch_main(["--dry-run", "--config_file", str(accelerate_file), "train.py"]) == 0
    out, err = capsys.readouterr()
    assert f"{accelerate_file} is an Accelerate config file: read as `accel config import" in err
    assert "warning: ipex_config" in err  # what the conversion drops, as `accel config import` says it
    assert "num_processes                2           (config file)" in out
    assert "ACCEL_MIXED_PRECISION=bf16" in out and "ACCEL_USE_CPU=true" in out
