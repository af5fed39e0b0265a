"""MegatronLMPlugin as data (from_env / to_env, refused settings) and the `accel launch` flags, without torch."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from accel_megatron.cli import MegatronLaunchOptions
from accel_megatron.plugin import MegatronLMPlugin


def test_env_round_trip() -> None:
    plugin = MegatronLMPlugin(tp_degree=4, sequence_parallelism=True, gradient_clipping=1.5, seed=7)
    environ = plugin.to_env()
    assert environ == {
        "ACCEL_MEGATRON_TP_DEGREE": "4",
        "ACCEL_MEGATRON_SEQUENCE_PARALLELISM": "true",
        "ACCEL_MEGATRON_GRADIENT_CLIPPING": "1.5",
        "ACCEL_MEGATRON_SEED": "7",
    }
    assert MegatronLMPlugin.from_env({**environ, "OTHER": "x"}) == plugin
    assert MegatronLMPlugin().to_env() == {}
    assert MegatronLMPlugin.from_env({}) == MegatronLMPlugin()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vp_degree": 2}, r"vp_degree=2\) needs pp_degree > 1"),
        ({"pp_degree": 2, "vp_degree": 2, "num_micro_batches": 3}, "multiple of pp_degree=2"),
        ({"use_distributed_optimizer": True}, "distributed optimizer is not supported"),
        ({"recompute_activations": True}, "is not supported by this version"),
        ({"sequence_parallelism": True}, "needs tp_degree > 1"),
        ({"tp_degree": 0}, "expected an integer >= 1"),
        ({"gradient_clipping": -1.0}, "expected a number >= 0"),
    ],
)
def test_refused_settings_name_the_fix(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        MegatronLMPlugin(**kwargs)


def test_micro_batches_without_pipeline_stages_are_accepted() -> None:
    # As in Megatron and Accelerate: micro-batches run through the no-pipelining schedule (tests/megatron/pp_checks.py).
    plugin = MegatronLMPlugin(num_micro_batches=2)
    assert (plugin.pp_degree, plugin.num_micro_batches) == (1, 2)
    assert MegatronLMPlugin.from_env(plugin.to_env()) == plugin


def test_world_size_must_be_a_multiple_of_tp_degree() -> None:
    assert MegatronLMPlugin(tp_degree=2).check_world_size(8) == 4
    with pytest.raises(ValueError, match=r"tp_degree=3, pp_degree=1\) does not divide the 4 processes.*in \[1, 2, 4\]"):
        MegatronLMPlugin(tp_degree=3).check_world_size(4)
    assert MegatronLMPlugin(tp_degree=2, pp_degree=2).check_world_size(8) == 2
    with pytest.raises(ValueError, match="model-parallel groups of tp_degree x pp_degree = 4"):
        MegatronLMPlugin(tp_degree=2, pp_degree=2).check_world_size(6)


def test_bad_and_unknown_environment_values() -> None:
    with pytest.raises(ValueError, match="ACCEL_MEGATRON_TP_DEGREE='two'"):
        MegatronLMPlugin.from_env({"ACCEL_MEGATRON_TP_DEGREE": "two"})
    with pytest.raises(ValueError, match=r"Unknown Megatron option.*ACCEL_MEGATRON_TP_SIZE"):
        MegatronLMPlugin.from_env({"ACCEL_MEGATRON_TP_SIZE": "2"})
    with pytest.raises(ValueError, match="virtual stages"):
        MegatronLMPlugin.from_env({"ACCEL_MEGATRON_VP_DEGREE": "2"})
    assert MegatronLMPlugin.from_env({"ACCEL_MEGATRON_PP_DEGREE": "2"}) == MegatronLMPlugin(pp_degree=2)


def _parse(*argv: str) -> dict[str, str]:
    options = MegatronLaunchOptions()
    parser = argparse.ArgumentParser()
    options.add_arguments(parser.add_argument_group("megatron options"))
    return options.to_env(parser.parse_args(argv))


def test_launch_flags_become_the_plugin() -> None:
    environ = _parse(
        "--use-megatron",
        "--megatron-tp-degree",
        "2",
        "--megatron_sequence_parallelism",
        "yes",
        "--megatron-gradient-clipping",
        "1.0",
    )
    assert environ == {
        "ACCEL_STRATEGY": "megatron",
        "ACCEL_MEGATRON_TP_DEGREE": "2",
        "ACCEL_MEGATRON_SEQUENCE_PARALLELISM": "true",
        "ACCEL_MEGATRON_GRADIENT_CLIPPING": "1.0",
    }
    assert MegatronLMPlugin.from_env(environ) == MegatronLMPlugin(
        tp_degree=2, sequence_parallelism=True, gradient_clipping=1.0
    )
    assert _parse("--megatron-tp-degree", "4")["ACCEL_STRATEGY"] == "megatron"  # any flag selects the strategy
    assert _parse() == {}
    with pytest.raises(SystemExit):
        _parse("--megatron-tp-degree", "-1")


def test_plugin_cli_and_public_names_import_neither_torch_nor_megatron() -> None:
    code = (
        "import json, sys\n"
        "import accel_megatron.cli, accel_megatron.plugin\n"
        "from accel.utils import MegatronLMPlugin\n"
        "import accel\n"
        "assert accel.MegatronLMPlugin is MegatronLMPlugin\n"
        "MegatronLMPlugin(tp_degree=2).to_env()\n"
        "print(json.dumps(sorted(m for m in ('torch', 'megatron') if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_schedule_shape_options() -> None:
    plugin = MegatronLMPlugin(lr_decay_style="cosine", min_lr=1e-5)
    assert plugin.to_env() == {"ACCEL_MEGATRON_LR_DECAY_STYLE": "cosine", "ACCEL_MEGATRON_MIN_LR": "1e-05"}
    assert MegatronLMPlugin.from_env(plugin.to_env()) == plugin
    with pytest.raises(ValueError, match="linear, cosine, constant or inverse-square-root"):
        MegatronLMPlugin(lr_decay_style="step")
    with pytest.raises(ValueError, match="min_lr"):
        MegatronLMPlugin(min_lr=-1.0)
