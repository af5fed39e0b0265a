"""DeepSpeedPlugin, "auto" filling and the launcher flags: pure Python, no torch, no processes."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys

import pytest

from accel_deepspeed.cli import DeepSpeedLaunchOptions
from accel_deepspeed.config import fill_auto, get_value, load_config, remaining_auto
from accel_deepspeed.plugin import DeepSpeedPlugin


def test_default_config_has_autos_and_no_silent_clipping() -> None:
    plugin = DeepSpeedPlugin()
    config = plugin.deepspeed_config
    assert (
        config["train_batch_size"]
        == config["train_micro_batch_size_per_gpu"]
        == config["gradient_accumulation_steps"]
        == "auto"
    )
    assert config["zero_optimization"]["stage"] == 2 and plugin.zero_stage == 2
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "none"}
    # DeepSpeed >= 0.17 would clip at 1.0 when the key is absent: accel writes 0 (off) unless asked.
    assert config["gradient_clipping"] == 0.0
    assert DeepSpeedPlugin(gradient_clipping=0.5).deepspeed_config["gradient_clipping"] == 0.5
    assert plugin.zero3_save_16bit_model is False and plugin.effective_precision == "no"


def test_fields_fill_a_config_or_must_agree_with_it() -> None:
    given = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": "auto"}}
    plugin = DeepSpeedPlugin(
        hf_ds_config=given, zero_stage=3, zero3_save_16bit_model=True, offload_optimizer_device="cpu"
    )
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == 3 and plugin.zero_stage == 3
    assert plugin.deepspeed_config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert plugin.offload_optimizer_device == "cpu"
    assert given["zero_optimization"]["stage"] == "auto", "the user's dict is copied, not changed"
    assert DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}}, zero_stage=2).zero_stage == 2
    with pytest.raises(ValueError, match=r"zero_stage=3.*contradicts `zero_optimization.stage`: 2"):
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}}, zero_stage=3)
    with pytest.raises(ValueError, match="gradient_clipping"):
        DeepSpeedPlugin(hf_ds_config={"gradient_clipping": 1.0}, gradient_clipping=2.0)


def test_config_file(tmp_path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "bf16": {"enabled": "auto"}}))
    plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    assert plugin.zero_stage == 1
    assert plugin.set_mixed_precision("bf16") == "bf16" and plugin.deepspeed_config["bf16"]["enabled"] is True
    with pytest.raises(ValueError, match="does not exist"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"zero_stage": 4}, "zero_stage must be 0, 1, 2 or 3"),
        ({"offload_optimizer_device": "gpu"}, "offload_optimizer_device must be one of none, cpu, nvme"),
        ({"zero_stage": 2, "offload_param_device": "cpu"}, "Parameter offload .* needs ZeRO stage 3"),
        ({"offload_optimizer_device": "nvme"}, "needs a folder: set offload_optimizer_nvme_path"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be an integer >= 1"),
        ({"gradient_clipping": -1.0}, "gradient_clipping must be >= 0"),
    ],
)
def test_invalid_fields(kwargs, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        DeepSpeedPlugin(**kwargs)


def test_zero3_init_flag_only_for_stage_3(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        plugin = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert plugin.zero3_init_flag is False and "only applies to ZeRO stage 3" in caplog.text
    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True, offload_param_device="cpu")
    init = plugin.zero3_init_config()
    assert init["train_micro_batch_size_per_gpu"] == 1 and init["gradient_accumulation_steps"] == 1
    assert "train_batch_size" not in init and init["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert plugin.deepspeed_config["train_batch_size"] == "auto", "the plugin's own config keeps its autos"


def test_mixed_precision_rules() -> None:
    plugin = DeepSpeedPlugin()
    assert plugin.set_mixed_precision("fp16") == "fp16"
    assert plugin.deepspeed_config["fp16"] == {"enabled": True, "auto_cast": True}
    with pytest.raises(ValueError, match="cannot be set to `bf16` when `fp16` is set in the DeepSpeed config file"):
        plugin.set_mixed_precision("bf16")
    # An explicit config wins over mixed_precision="no": the Accelerator then reports bf16.
    assert DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": True}}).set_mixed_precision("no") == "bf16"
    auto = DeepSpeedPlugin(hf_ds_config={"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}})
    assert auto.set_mixed_precision("no") == "no" and auto.deepspeed_config["fp16"]["enabled"] is False
    with pytest.raises(ValueError, match="not supported with DeepSpeed"):
        DeepSpeedPlugin().set_mixed_precision("fp8")


def test_auto_filling() -> None:
    config = {"a": "auto", "b": {"c": "auto", "d": 3}, "e": "AUTO"}
    fill_auto(config, {"a": 1, "b.c": 2, "b.d": 9, "missing.key": 5, "f": 6})
    assert config == {"a": 1, "b": {"c": 2, "d": 3}, "e": "AUTO"}, "only autos filled; nothing added"
    assert remaining_auto(config) == ["e"] and get_value(config, "b.c") == 2 and get_value(config, "x.y", 7) == 7
    plugin = DeepSpeedPlugin(hf_ds_config={"optimizer": {"params": {"lr": 0.1}}})
    with pytest.raises(ValueError, match="mismatch"):
        plugin.deepspeed_config_process(must_match=True, **{"optimizer.params.lr": 0.2})
    plugin.deepspeed_config_process(must_match=False, **{"optimizer.params.lr": 0.2})
    assert plugin.deepspeed_config["optimizer"]["params"]["lr"] == 0.1
    assert load_config({"x": {"y": 1}}) == {"x": {"y": 1}}


def test_from_env(tmp_path, caplog) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    environ = {
        "ACCEL_DEEPSPEED_CONFIG_FILE": str(path),
        "ACCEL_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        "ACCEL_DEEPSPEED_ZERO3_INIT_FLAG": "true",
        "ACCEL_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "1",
        "ACCEL_DEEPSPEED_GRADIENT_CLIPPING": "1.0",
        "ACCEL_DEEPSPEED_GRADIENT_ACCUMULATION_STEPS": "auto",
        "ACCEL_DEEPSPEED_MULTINODE_LAUNCHER": "standard",  # DeepSpeed's launcher: not used, silently
        "ACCEL_DEEPSPEED_ZERO_STAGE_TYPO": "3",
    }
    with caplog.at_level(logging.WARNING):
        plugin = DeepSpeedPlugin.from_env(environ)
    assert plugin.zero_stage == 3 and plugin.offload_optimizer_device == "cpu" and plugin.zero3_init_flag is True
    assert plugin.zero3_save_16bit_model is True and plugin.deepspeed_config["gradient_clipping"] == 1.0
    assert "ZERO_STAGE_TYPO" in caplog.text and "MULTINODE" not in caplog.text
    with pytest.raises(ValueError, match="ACCEL_DEEPSPEED_ZERO_STAGE='two' must be an integer"):
        DeepSpeedPlugin.from_env({"ACCEL_DEEPSPEED_ZERO_STAGE": "two"})
    assert DeepSpeedPlugin.from_env({}).zero_stage == 2


def parse(*flags: str) -> dict[str, str]:
    parser = argparse.ArgumentParser(exit_on_error=False)
    options = DeepSpeedLaunchOptions()
    options.add_arguments(parser.add_argument_group("deepspeed options"))
    return options.to_env(parser.parse_args(list(flags)))


def test_launch_flags() -> None:
    assert parse() == {}
    assert parse("--use-deepspeed") == {"ACCEL_STRATEGY": "deepspeed"}
    assert parse(
        "--zero_stage",
        "3",
        "--offload-optimizer-device",
        "CPU",
        "--zero3-init-flag",
        "yes",
        "--gradient-clipping",
        "1.0",
    ) == {
        "ACCEL_STRATEGY": "deepspeed",  # any DeepSpeed flag selects the strategy
        "ACCEL_DEEPSPEED_ZERO_STAGE": "3",
        "ACCEL_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
        "ACCEL_DEEPSPEED_ZERO3_INIT_FLAG": "true",
        "ACCEL_DEEPSPEED_GRADIENT_CLIPPING": "1.0",
    }
    assert parse("--deepspeed-config-file", "ds.json")["ACCEL_DEEPSPEED_CONFIG_FILE"] == "ds.json"
    for bad in (["--zero-stage", "4"], ["--offload-param-device", "gpu"], ["--zero3-init-flag", "maybe"]):
        with pytest.raises((argparse.ArgumentError, SystemExit)):
            parse(*bad)


def test_accel_launch_dry_run_and_light_imports(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    command = [sys.executable, "-c", "import sys; from accel.cli import main; sys.exit(main())"]
    result = subprocess.run(
        [*command, "launch", "--dry-run", "--cpu", "-n", "2", "--use-deepspeed", "--zero-stage", "3", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "ACCEL_STRATEGY=deepspeed" in result.stdout and "ACCEL_DEEPSPEED_ZERO_STAGE=3" in result.stdout
    probe = (
        "import sys, accel_deepspeed, accel_deepspeed.cli, accel_deepspeed.plugin; "
        "print('torch' in sys.modules, 'deepspeed' in sys.modules)"
    )
    light = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert light.stdout.split() == ["False", "False"], light.stderr
