"""HfDeepSpeedConfig (accel.utils.deepspeed): the DeepSpeed config transformers queries before any engine exists."""

from __future__ import annotations

import base64
import json

import pytest

from accel.utils.deepspeed import HfDeepSpeedConfig

ZERO3_OFFLOAD = {
    "train_micro_batch_size_per_gpu": "auto",
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "reduce_scatter": False},
    "bf16": {"enabled": True},
}


def test_answers_stage_offload_and_values_as_accelerate_does() -> None:
    config = HfDeepSpeedConfig(ZERO3_OFFLOAD)
    assert config.is_zero3() and not config.is_zero2() and config.is_offload()
    assert config.get_value("zero_optimization.stage") == 3
    assert config.get_value("zero_optimization.offload_param.device") == "cpu"
    assert config.get_value("zero_optimization.missing", "default") == "default"
    assert config.get_value("no_such_section.key") is None
    assert config.is_true("bf16.enabled") and not config.is_false("bf16.enabled")
    assert config.is_false("zero_optimization.reduce_scatter")
    assert not config.is_true("fp16.enabled") and not config.is_false("fp16.enabled")  # not set: neither
    assert config.find_config_node("zero_optimization.stage") == (config.config["zero_optimization"], "stage")
    config.config["zero_optimization"]["stage"] = 1
    assert config.is_zero3()  # read once...
    config.set_stage_and_offload()
    assert not config.is_zero3() and not config.is_offload()  # ...until asked again (stage 1 does not offload)


def test_the_callers_dict_is_copied_and_subtrees_can_be_deleted() -> None:
    config = HfDeepSpeedConfig(ZERO3_OFFLOAD)
    config.del_config_sub_tree("zero_optimization.offload_param")
    assert "offload_param" not in config.config["zero_optimization"]
    assert ZERO3_OFFLOAD["zero_optimization"]["offload_param"] == {"device": "cpu"}  # the caller's dict unchanged
    config.del_config_sub_tree("absent.key")  # missing: ignored
    with pytest.raises(ValueError, match=r"Can.t find absent\.key"):
        config.del_config_sub_tree("absent.key", must_exist=True)


def test_reads_a_file_a_json_string_and_base64(tmp_path) -> None:
    stage2 = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(stage2))
    encoded = base64.urlsafe_b64encode(json.dumps(stage2).encode()).decode()
    for source in (str(path), path, json.dumps(stage2), encoded):
        config = HfDeepSpeedConfig(source)
        assert config.is_zero2() and config.is_offload(), source
    assert HfDeepSpeedConfig({}).get_value("zero_optimization.stage", -1) == -1
    with pytest.raises(ValueError, match="Expected a string path to an existing deepspeed config"):
        HfDeepSpeedConfig("not a config")


def test_subclassing_as_transformers_does() -> None:
    """transformers' HfTrainerDeepSpeedConfig subclasses it and calls the base __init__."""

    class TrainerConfig(HfDeepSpeedConfig):
        def __init__(self, source: dict) -> None:
            super().__init__(source)
            self.mismatches: list[str] = []

    config = TrainerConfig(ZERO3_OFFLOAD)
    assert config.is_zero3() and config.mismatches == []
