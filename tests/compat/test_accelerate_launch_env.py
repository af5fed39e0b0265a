"""Scripts started by `accelerate launch` after only their import changed: accel reads the settings Accelerate's
launcher hands its workers (ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_FSDP with FSDP_*, ...), as the reference
Accelerator does, and refuses the ones it cannot honour (accel_core.accelerate_launch_env).

The variables are Accelerate 1.16's own, recorded by tests/compat/capture_accelerate_launch_env.py with Accelerate's
launch code (accelerate_launch_env.json), so these tests need no Accelerate installed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from accel_core.accelerate_launch_env import AccelerateLaunchError, translate
from accel_core.settings import settle

HERE = Path(__file__).resolve().parent
RECORDED = json.loads((HERE / "accelerate_launch_env.json").read_text())
SCRIPT = HERE / "scripts" / "accelerate_launched.py"


def _variables(line: str) -> dict[str, str]:
    return dict(RECORDED["lines"][line]["variables"])


def test_the_recording_is_accelerates_own() -> None:
    assert RECORDED["accelerate"] == "1.16.0"
    assert _variables("cpu_bf16_compile_debug")["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert _variables("fsdp2_size_wrap")["ACCELERATE_USE_FSDP"] == "true"


def test_every_run_setting_is_read_under_accels_name() -> None:
    found, refused = translate(_variables("cpu_bf16_compile_debug"))
    assert refused == []
    assert found == {
        "ACCEL_USE_CPU": "True",
        "ACCEL_MIXED_PRECISION": "bf16",
        "ACCEL_DEBUG_MODE": "true",
        "ACCEL_DYNAMO_BACKEND": "eager",  # Accelerate writes its enum's value, EAGER
        "ACCEL_DYNAMO_MODE": "reduce-overhead",
        "ACCEL_DYNAMO_USE_DYNAMIC": "True",
        "ACCEL_DYNAMO_USE_FULLGRAPH": "False",
        "ACCEL_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    }


def test_backend_switches_choose_the_strategy_and_their_options_follow() -> None:
    found, refused = translate(_variables("fsdp2_size_wrap"))
    assert refused == []
    assert found["ACCEL_STRATEGY"] == "fsdp" and found["ACCEL_FSDP_VERSION"] == "2"
    assert found["ACCEL_FSDP_AUTO_WRAP_POLICY"] == "SIZE_BASED_WRAP" and found["ACCEL_FSDP_MIN_NUM_PARAMS"] == "1000"
    # Accelerate writes every FSDP option, its defaults too; one accel has not, at its default, asks for nothing.
    assert "ACCEL_FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD" not in found
    found, refused = translate(_variables("deepspeed_zero2_accumulation"))
    assert refused == []
    assert found["ACCEL_STRATEGY"] == "deepspeed" and found["ACCEL_DEEPSPEED_ZERO_STAGE"] == "2"
    assert found["ACCEL_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert found["ACCEL_DEEPSPEED_GRADIENT_CLIPPING"] == "1.0"  # Accelerate's ACCELERATE_GRADIENT_CLIPPING
    found, refused = translate(_variables("megatron_tp2"))
    assert refused == [] and found["ACCEL_STRATEGY"] == "megatron"
    assert (found["ACCEL_MEGATRON_TP_DEGREE"], found["ACCEL_MEGATRON_NUM_MICRO_BATCHES"]) == ("2", "2")


def test_a_backend_the_script_builds_itself_reads_the_settled_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """`DeepSpeedStrategy()` / `MegatronStrategy()` made by a script without an Accelerator, and the FSDP, DeepSpeed
    and Megatron plugins' `from_env()`, settle the environment as `Accelerator()` does: `accelerate launch`'s
    variables reach them too."""
    pytest.importorskip("torch")
    from accel_deepspeed import DeepSpeedPlugin
    from accel_deepspeed.strategy import DeepSpeedStrategy
    from accel_fsdp import FullyShardedDataParallelPlugin
    from accel_megatron import MegatronLMPlugin
    from accel_megatron.strategy import MegatronStrategy

    for name in [n for n in os.environ if n.startswith(("ACCEL_", "ACCELERATE_", "MEGATRON_LM_"))]:
        monkeypatch.delenv(name)  # only Accelerate's spelling: what the translation gives is what is read
    with monkeypatch.context() as launched:
        for name, value in _variables("deepspeed_zero2_accumulation").items():
            launched.setenv(name, value)
        deepspeed = DeepSpeedStrategy().plugin
        assert (deepspeed.zero_stage, deepspeed.gradient_clipping) == (2, 1.0)  # ACCELERATE_GRADIENT_CLIPPING
        assert DeepSpeedPlugin.from_env().gradient_clipping == 1.0
    with monkeypatch.context() as launched:
        for name, value in _variables("megatron_tp2").items():
            launched.setenv(name, value)
        megatron = MegatronStrategy().plugin
        assert (megatron.tp_degree, megatron.num_micro_batches, megatron.gradient_clipping) == (2, 2, 1.0)
        assert MegatronLMPlugin.from_env() == megatron
        assert MegatronLMPlugin.from_env({}) == MegatronLMPlugin()  # a record given is read, not the environment
    with monkeypatch.context() as launched:
        for name, value in _variables("fsdp2_size_wrap").items():
            launched.setenv(name, value)
        fsdp = FullyShardedDataParallelPlugin.from_env()  # FSDP_AUTO_WRAP_POLICY, FSDP_MIN_NUM_PARAMS translated
        assert (fsdp.fsdp_version, fsdp.auto_wrap_policy, fsdp.min_num_params) == (2, "SIZE_BASED_WRAP", 1000)
        assert FullyShardedDataParallelPlugin.from_env({}) == FullyShardedDataParallelPlugin()


def test_accels_own_spelling_wins() -> None:
    environ = {**_variables("cpu_bf16_compile_debug"), "ACCEL_MIXED_PRECISION": "no"}
    given = dict(environ)
    settings = settle(environ)
    assert settings.environ["ACCEL_MIXED_PRECISION"] == "no" and "ACCEL_MIXED_PRECISION" not in settings.translated
    assert settings.environ["ACCEL_DYNAMO_BACKEND"] == "eager"
    assert environ == given  # settling only reads


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("megatron_recompute_granularity", "MEGATRON_LM_RECOMPUTE_GRANULARITY=full: accel's megatron strategy has no"),
        ("fsdp_activation_checkpointing_offload", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD=true: accel's fsdp strategy"),
    ],
)
def test_a_setting_accel_cannot_honour_is_refused_naming_it(line: str, named: str) -> None:
    environ = _variables(line)
    with pytest.raises(AccelerateLaunchError) as refused:
        settle(environ)
    assert named in str(refused.value) and "`accel launch` and the same flags" in str(refused.value)
    assert not any(name.startswith("ACCEL_") for name in environ)  # nothing half-adopted


def _reports(output: str) -> list[dict]:
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in output.splitlines() if "REPORT " in line]
    return sorted(reports, key=lambda report: report["rank"])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_scripts_started_by_accelerate_launch_train_as_it_asked(torchrun) -> None:
    """Two processes each with Accelerate's recorded variables (and no ACCEL_* setting): bf16 with the compile
    settings; FSDP2 that holds half the parameters; DeepSpeed ZeRO-2 with 4 accumulation steps and clipping."""
    simple = _reports(torchrun(SCRIPT, env=_variables("cpu_bf16_compile_debug")).stdout)
    assert [report["rank"] for report in simple] == [0, 1]
    for report in simple:
        assert report["mixed_precision"] == "bf16" and report["debug"] is True, report
        assert report["environ_changed"] == [], report  # nothing written: the settings live in the Accelerator
        assert report["compile"] == {"backend": "eager", "mode": "reduce-overhead", "dynamic": True, "fullgraph": False}

    # Once aborted at exit in 2 of 4 CI runs: the stall watch's exit race (tests/core/test_stall_watch_exit.py).
    launched = torchrun(SCRIPT, env=_variables("fsdp2_size_wrap"))
    fsdp = _reports(launched.stdout)
    assert [report["rank"] for report in fsdp] == [0, 1], launched.stdout + launched.stderr[-4000:]
    for report in fsdp:
        assert report["distributed_type"].endswith("FSDP") and report["mixed_precision"] == "bf16", report
        assert report["fsdp"] == {"version": 2, "min_num_params": 1000}, report
        assert report["held_numel"] * 2 == report["full_numel"], report  # sharded over the 2 processes
        assert report["environ_changed"] == [], report

    deepspeed = _reports(torchrun(SCRIPT, env=_variables("deepspeed_zero2_accumulation"), timeout=400).stdout)
    assert [report["rank"] for report in deepspeed] == [0, 1]
    for report in deepspeed:
        assert report["distributed_type"].endswith("DEEPSPEED") and report["gradient_accumulation_steps"] == 4
        assert report["deepspeed"] == {"zero_stage": 2, "gradient_clipping": 1.0, "gradient_accumulation_steps": 4}
        # accel's DS_ACCELERATOR lasted only while deepspeed was imported; `import deepspeed` itself sets
        # PYTORCH_NVML_BASED_CUDA_CHECK (deepspeed/__init__.py: os.environ.setdefault), which is DeepSpeed's own.
        assert set(report["environ_changed"]) <= {"PYTORCH_NVML_BASED_CUDA_CHECK"}, report
