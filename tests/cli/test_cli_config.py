"""The config file: location, checks, Accelerate import, and the `accel config` commands."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from accel_launch.accelerate_import import convert_accelerate_config
from accel_launch.config import config_path, default_config_path, load_config, read_config, write_config

ACCELERATE_FSDP = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

ACCELERATE_MULTI_GPU = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
gpu_ids: 0,1
ipex_config:
  ipex: true
mixed_precision: fp16
num_machines: 2
num_processes: 4
machine_rank: 1
main_process_ip: 10.1.2.3
main_process_port: 6000
"""


def test_config_location_flag_then_environment_then_xdg_then_home(tmp_path: Path) -> None:
    assert config_path("a.yaml", {"ACCEL_CONFIG_FILE": "b.yaml"}) == (Path("a.yaml"), True)
    assert config_path(None, {"ACCEL_CONFIG_FILE": "b.yaml"}) == (Path("b.yaml"), True)
    assert default_config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/accel/default_config.yaml")
    assert default_config_path({"HOME": str(tmp_path)}).parts[-3:] == (".config", "accel", "default_config.yaml")
    # No default file (neither accel's nor Accelerate's): no config.
    assert load_config(None, {"XDG_CONFIG_HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}) == ({}, None)
    with pytest.raises(ValueError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"), {})


def test_written_config_reads_back_and_bad_keys_are_named(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "d" / "c.yaml", {"num_processes": 2, "mixed_precision": "no", "fsdp": {"version": 2}}
    )
    text = path.read_text()
    assert text.startswith("# accel launch configuration") and "mixed_precision: 'no'" in text
    assert read_config(path) == {"num_processes": 2, "mixed_precision": "no", "fsdp": {"version": 2}}
    (tmp_path / "typo.yaml").write_text("num_process: 2\n")
    with pytest.raises(ValueError, match="Did you mean 'num_processes'"):
        read_config(tmp_path / "typo.yaml")
    (tmp_path / "bad.yaml").write_text("mixed_precision: fp12\n")
    with pytest.raises(ValueError, match=r"bad\.yaml key 'mixed_precision'"):
        read_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="mapping"):
        read_config(tmp_path / "list.yaml")


def test_accelerate_fsdp_config_converts_without_warnings() -> None:
    config, warnings = convert_accelerate_config(yaml.safe_load(ACCELERATE_FSDP))
    assert warnings == []
    assert config == {
        "debug": False,
        "strategy": "fsdp",
        "fsdp": {
            "activation_checkpointing": False,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "cpu_ram_efficient_loading": True,
            "offload_params": False,
            "reshard_after_forward": True,
            "state_dict_type": "SHARDED_STATE_DICT",
            "transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
            "version": 2,
        },
        "machine_rank": 0,
        "mixed_precision": "bf16",
        "num_machines": 1,
        "num_processes": 8,
        "rdzv_backend": "static",
        "use_cpu": False,
    }


def test_accelerate_multi_gpu_config_keeps_what_maps_and_warns_about_the_rest() -> None:
    config, warnings = convert_accelerate_config(yaml.safe_load(ACCELERATE_MULTI_GPU))
    # dynamo_mode reaches the workers' TorchDynamoPlugin as ACCEL_DYNAMO_MODE.
    assert config["dynamo_backend"] == "inductor"
    assert config["env"] == {"ACCEL_DYNAMO_MODE": "max-autotune", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert (config["num_machines"], config["machine_rank"], config["main_process_ip"]) == (2, 1, "10.1.2.3")
    assert "strategy" not in config  # MULTI_GPU: the automatic choice (DDP)
    assert len(warnings) == 1 and "ipex_config" in warnings[0]
    cpu, _ = convert_accelerate_config({"distributed_type": "MULTI_CPU", "num_processes": 2})
    assert cpu == {"num_processes": 2, "use_cpu": True}
    deepspeed, warnings = convert_accelerate_config(
        {
            "distributed_type": "DEEPSPEED",
            "deepspeed_config": {"zero_stage": 2, "deepspeed_multinode_launcher": "standard"},
        }
    )
    assert deepspeed == {"strategy": "deepspeed", "deepspeed": {"zero_stage": 2, "multinode_launcher": "standard"}}
    _, warnings = convert_accelerate_config({"compute_environment": "AMAZON_SAGEMAKER", "ec2_instance_type": "x"})
    assert len(warnings) == 2


def test_accel_config_import_writes_a_config_that_launch_uses(cli, tmp_path: Path) -> None:
    source = tmp_path / "accelerate.yaml"
    source.write_text(ACCELERATE_MULTI_GPU)
    result = cli.run("config", "import", str(source))
    assert result.returncode == 0, cli.describe(result)
    assert "warning: ipex_config" in result.stderr
    written = yaml.safe_load((cli.config_dir / "default_config.yaml").read_text())
    assert written["num_processes"] == 4
    assert written["env"] == {"ACCEL_DYNAMO_MODE": "max-autotune", "CUDA_VISIBLE_DEVICES": "0,1"}
    again = cli.run("config", "import", str(source))
    assert again.returncode == 2 and "--force" in again.stderr

    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text(ACCELERATE_FSDP)
    assert cli.run("config", "import", str(fsdp), "--force").returncode == 0
    # The imported file drives a launch: settings and backend options reach the workers' environment.
    dry = cli.run(
        "launch", "--dry-run", "-n", "2", "train.py", "--lr", "1", env_extra={"ACCEL_MIXED_PRECISION": "fp16"}
    )
    assert dry.returncode == 0, cli.describe(dry)
    assert (
        "ACCEL_STRATEGY=fsdp" in dry.stdout
        and "ACCEL_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP=LlamaDecoderLayer" in dry.stdout
    )
    assert "ACCEL_MIXED_PRECISION=fp16" in dry.stdout  # the environment beats the file's bf16
    assert "--nproc-per-node=2 -m accel_launch.runner path train.py --lr 1" in dry.stdout  # the flag beats 8


def test_accel_config_questions_keep_defaults_and_reask_bad_answers(cli) -> None:
    cli.config_dir.mkdir(parents=True)
    (cli.config_dir / "default_config.yaml").write_text("num_processes: 2\nuse_cpu: true\nenv:\n  KEEP: me\n")
    # machines, cpu only, processes, strategy, precision, accumulation (bad then good), dynamo, debug.
    answers = "1\n\n3\n\nBF16\nzero\n2\n\n\n"
    result = cli.run("config", stdin=answers)
    assert result.returncode == 0, cli.describe(result)
    assert "please answer with a whole number" in result.stdout and "Wrote" in result.stdout
    written = yaml.safe_load((cli.config_dir / "default_config.yaml").read_text())
    assert written["num_processes"] == 3 and written["use_cpu"] is True and written["mixed_precision"] == "bf16"
    assert written["gradient_accumulation_steps"] == 2 and written["debug"] is False
    assert written["env"] == {"KEEP": "me"} and "strategy" not in written


def test_accel_config_asks_the_chosen_backends_options_and_launch_uses_them(cli) -> None:
    cli.config_dir.mkdir(parents=True)
    (cli.config_dir / "default_config.yaml").write_text("use_cpu: true\nfsdp:\n  offload_params: true\n  version: 1\n")
    # machines, cpu, processes, strategy, "set fsdp options?" (y, as people type it), then the fsdp table in order:
    # version (Enter keeps 1), sharding strategy (bad, then by position), reshard (Enter: unset),
    # offload (Enter keeps true), auto-wrap policy; Enter keeps the rest.
    answers = "1\n\n2\nfsdp\ny\n\nHALF_SHARD\n2\n\n\nsize_based_wrap\n" + "\n" * 20
    result = cli.run("config", stdin=answers)
    assert result.returncode == 0, cli.describe(result)
    assert "'HALF_SHARD' is not one of FULL_SHARD" in result.stdout
    written = yaml.safe_load((cli.config_dir / "default_config.yaml").read_text())
    assert written["strategy"] == "fsdp"
    assert written["fsdp"] == {
        "version": 1,
        "sharding_strategy": "SHARD_GRAD_OP",
        "offload_params": True,
        "auto_wrap_policy": "SIZE_BASED_WRAP",
    }
    dry = cli.run("launch", "--dry-run", "train.py")
    assert dry.returncode == 0, cli.describe(dry)
    for pair in (
        "ACCEL_STRATEGY=fsdp",
        "ACCEL_FSDP_VERSION=1",
        "ACCEL_FSDP_SHARDING_STRATEGY=SHARD_GRAD_OP",
        "ACCEL_FSDP_OFFLOAD_PARAMS=true",
        "ACCEL_FSDP_AUTO_WRAP_POLICY=SIZE_BASED_WRAP",
    ):
        assert pair in dry.stdout, pair


def test_accel_config_show_tells_where_each_setting_comes_from(cli) -> None:
    missing = cli.run("config", "show")
    assert missing.returncode == 0 and "does not exist" in missing.stdout
    cli.config_dir.mkdir(parents=True)
    (cli.config_dir / "default_config.yaml").write_text("num_processes: 2\nmixed_precision: bf16\n")
    shown = cli.run("config", "show", env_extra={"ACCEL_MIXED_PRECISION": "fp16"})
    lines = shown.stdout.splitlines()
    assert any(line.split()[:3] == ["num_processes", "2", "(config"] for line in lines), shown.stdout
    assert any(line.split()[:3] == ["mixed_precision", "fp16", "(environment)"] for line in lines), shown.stdout
    (cli.config_dir / "default_config.yaml").write_text("num_process: 2\n")
    typo = cli.run("launch", "--dry-run", "x.py")
    assert typo.returncode == 2 and "Did you mean 'num_processes'" in typo.stderr


def test_accel_config_default_writes_this_machines_config(cli) -> None:
    result = cli.run("config", "default", "--config-file", str(cli.home / "mine.yaml"))
    assert result.returncode == 0, cli.describe(result)
    written = read_config(cli.home / "mine.yaml")
    assert written["num_processes"] >= 1 and isinstance(written["use_cpu"], bool) and written["mixed_precision"] == "no"


def test_deepspeed_section_accumulation_steps_become_the_accelerator_setting():
    config, _ = convert_accelerate_config(
        {"distributed_type": "DEEPSPEED", "deepspeed_config": {"gradient_accumulation_steps": 4, "zero_stage": 2}}
    )
    assert config["gradient_accumulation_steps"] == 4
    assert config["deepspeed"] == {"zero_stage": 2}
    assert config["strategy"] == "deepspeed"


def test_unreadable_config_files_are_named_with_the_fix(cli, tmp_path: Path) -> None:
    """A directory, a binary file, corrupt YAML and a missing import source: one clear line each, no traceback."""
    binary = tmp_path / "config.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    folder = tmp_path / "configs"
    folder.mkdir()
    broken = tmp_path / "broken.yaml"
    broken.write_text("num_processes: [2\nmixed_precision: bf16\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    cases = [
        (("launch", "--dry-run", "--config-file", str(folder), "train.py"), "is a directory"),
        (("config", "show", "--config-file", str(folder)), "is a directory"),
        (("launch", "--dry-run", "--config-file", str(binary), "train.py"), "is not a text file (binary content)"),
        (("config", "show", "--config-file", str(binary)), "is not a text file"),
        (("launch", "--dry-run", "--config-file", str(broken), "train.py"), "is not valid YAML"),
        (("config", "import", str(broken)), "Accelerate config file"),
        (("config", "import", str(binary)), "is not a text file"),
        (("config", "import", str(folder)), "is a directory"),
        (("config", "import", str(listed)), "holds a YAML list, not the mapping"),
        (("config", "import", str(tmp_path / "missing.yaml")), "does not exist: pass the file `accelerate config`"),
    ]
    cli.config_dir.mkdir(parents=True)
    (cli.config_dir / "default_config.yaml").write_text("num_processes: 1\n")  # the import must not blame this one
    for args, expected in cases:
        result = cli.run(*args)
        assert result.returncode == 2, cli.describe(result)
        assert expected in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
        assert "--force" not in result.stderr, (args, result.stderr)


def test_accel_config_writes_nothing_when_stdin_ends_before_the_last_question(cli) -> None:
    target = cli.config_dir / "default_config.yaml"
    for answers in ("", "1\n", "1\n\n2\n"):  # closed at once, after the first question, halfway
        result = cli.run("config", stdin=answers)
        assert result.returncode == 2, cli.describe(result)
        assert "standard input ended at the question" in result.stderr and "nothing was written" in result.stderr
        assert "accel config default" in result.stderr and "Traceback" not in result.stderr
        assert not target.exists()
    cli.config_dir.mkdir(parents=True)
    target.write_text("num_processes: 3\n")
    assert cli.run("config", stdin="2\n").returncode == 2
    assert target.read_text() == "num_processes: 3\n"  # the existing file is left as it was


def test_accel_config_show_shows_a_file_launch_refuses_with_a_warning_per_key(cli, tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("num_process: 2\nmixed_precision: bf16\nuse_cpu: maybe\n")
    shown = cli.run("config", "show", "--config-file", str(config))
    assert shown.returncode == 0, cli.describe(shown)
    assert "num_process: 2\nmixed_precision: bf16\nuse_cpu: maybe" in shown.stdout  # the file as written
    assert "warning: " in shown.stdout and "unknown setting 'num_process'" in shown.stdout
    assert "Did you mean 'num_processes'" in shown.stdout and "key 'use_cpu'" in shown.stdout
    lines = shown.stdout.splitlines()
    assert any(line.split()[:3] == ["mixed_precision", "bf16", "(config"] for line in lines), shown.stdout
    assert any(line.split()[:3] == ["num_processes", "1", "(default)"] for line in lines), shown.stdout
    refused = cli.run("launch", "--dry-run", "--config-file", str(config), "x.py")  # launch still refuses it
    assert refused.returncode == 2 and "unknown setting 'num_process'" in refused.stderr


def test_accel_config_default_names_a_path_it_cannot_write(cli, tmp_path: Path) -> None:
    for path in ("/proc/x.yaml", str(tmp_path / "file.txt" / "config.yaml")):
        (tmp_path / "file.txt").write_text("a file, not a folder")
        result = cli.run("config", "default", "--config-file", path)
        assert result.returncode == 2, cli.describe(result)
        assert f"cannot write the config file {path}" in result.stderr and "--config-file" in result.stderr
        assert "Traceback" not in result.stderr


# What `accelerate config` writes for FSDP1 (Accelerate 1.x, fsdp_version 1).
ACCELERATE_FSDP1 = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_use_orig_params: true
  fsdp_version: 1
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


def test_accel_to_fsdp2_converts_accelerate_and_accel_fsdp1_files(cli, tmp_path: Path) -> None:
    from accel_fsdp import FullyShardedDataParallelPlugin

    accelerate_file = tmp_path / "accelerate_fsdp1.yaml"
    accelerate_file.write_text(ACCELERATE_FSDP1)
    # An Accelerate file stays an Accelerate file, with Accelerate's FSDP2 keys.
    converted = tmp_path / "accelerate_fsdp2.yaml"
    result = cli.run("to-fsdp2", "--config-file", str(accelerate_file), "--output-file", str(converted))
    assert result.returncode == 0, cli.describe(result)
    section = yaml.safe_load(converted.read_text())["fsdp_config"]
    assert section["fsdp_version"] == 2 and section["fsdp_reshard_after_forward"] is False
    for dropped in (
        "fsdp_sharding_strategy",
        "fsdp_backward_prefetch",
        "fsdp_forward_prefetch",
        "fsdp_use_orig_params",
    ):
        assert dropped not in section and f"fsdp_config.{dropped}" in result.stderr, dropped
    assert section["fsdp_transformer_layer_cls_to_wrap"] == "Block" and section["fsdp_sync_module_states"] is True
    assert accelerate_file.read_text() == ACCELERATE_FSDP1  # the input is left alone
    again = cli.run("to-fsdp2", "--config-file", str(accelerate_file), "--output-file", str(converted))
    assert again.returncode == 2 and "pass --overwrite" in again.stderr

    # accel's own file (imported from the same Accelerate file), rewritten in place; launch then runs FSDP2.
    assert cli.run("config", "import", str(accelerate_file)).returncode == 0
    assert "version: 1" in (cli.config_dir / "default_config.yaml").read_text()
    rewritten = cli.run("to-fsdp2", "--overwrite")
    assert rewritten.returncode == 0, cli.describe(rewritten)
    assert "fsdp.sharding_strategy: SHARD_GRAD_OP became reshard_after_forward: false" in rewritten.stderr
    dry = cli.run("launch", "--dry-run", "train.py")
    assert dry.returncode == 0, cli.describe(dry)
    pairs = dict(line.strip().split("=", 1) for line in dry.stdout.splitlines() if line.startswith("  ACCEL_FSDP_"))
    assert "ACCEL_FSDP_BACKWARD_PREFETCH" not in pairs and "ACCEL_FSDP_SHARDING_STRATEGY" not in pairs, pairs
    plugin = FullyShardedDataParallelPlugin.from_env(pairs)  # what the workers build from it
    assert (plugin.fsdp_version, plugin.reshard_after_forward, plugin.transformer_cls_names_to_wrap) == (
        2, False, ["Block"])  # fmt: skip
    done = cli.run("to-fsdp2", "--overwrite")
    assert done.returncode == 0 and "already sets FSDP2" in done.stdout


def test_to_fsdp2_keeps_hybrid_sharding_and_refuses_no_shard() -> None:
    from accel.commands.to_fsdp2 import convert_section

    hybrid, notes = convert_section({"sharding_strategy": "HYBRID_SHARD", "limit_all_gathers": True, "version": 1})
    assert hybrid == {"sharding_strategy": "HYBRID_SHARD", "reshard_after_forward": True, "version": 2}
    assert any("limit_all_gathers" in note for note in notes)
    unversioned, _ = convert_section({"fsdp_sharding_strategy": "FULL_SHARD"}, "fsdp_")  # Accelerate's default is 1
    assert unversioned == {"fsdp_reshard_after_forward": True, "fsdp_version": 2}
    with pytest.raises(ValueError, match="NO_SHARD does not exist in FSDP2"):
        convert_section({"sharding_strategy": "NO_SHARD"})


def test_a_section_option_no_strategy_reads_is_refused_before_anything_starts(tmp_path: Path, capsys) -> None:
    """Each section option becomes an ACCEL_<SECTION>_<OPTION> variable: a misspelt one would reach the workers as a
    variable nobody reads, and the setting would silently not apply (DeepSpeed's and XLA's workers skip it)."""
    from accel.cli import main as accel_main

    def launch(text: str) -> tuple[int, str, str]:
        config = tmp_path / "config.yaml"
        config.write_text(text)
        code = accel_main(["launch", "--dry-run", "--config-file", str(config), "train.py"])
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = launch("num_processes: 2\ndeepspeed:\n  zero_stag: 2\n  offload_optimizer_device: cpu\n")
    assert code == 2, err
    assert "the 'deepspeed:' section has option(s) the deepspeed strategy does not read: zero_stag" in err
    assert "(did you mean 'zero_stage'?)" in err and "Known: config_file, " in err
    code, _, err = launch("fsdpp:\n  sharding_strategy: FULL_SHARD\n")
    assert code == 2 and "section 'fsdpp:' is named almost like 'fsdp:', which it is taken to mean" in err, err
    code, _, err = launch("deepsped:\n  zero_stage: 2\n")
    assert code == 2 and "named almost like 'deepspeed:'" in err, err
    for section, option in (("megatron", "tp_degre"), ("xla", "devic"), ("fsdp", "sharding_stratgy")):
        code, _, err = launch(f"{section}:\n  {option}: 1\n")
        assert code == 2 and f"the '{section}:' section has option(s)" in err and option in err, err

    # What the strategies read passes, in either spelling, beside `env:` and fp8's section (no launcher flags).
    code, out, err = launch(
        "deepspeed:\n  zero_stage: 2\n  hostfile: hosts\nfsdp:\n  sharding-strategy: FULL_SHARD\nfp8:\n  backend: AO\n"
        "megatron:\n  tp_degree: 1\nxla:\n  device: CPU\nenv:\n  MY_VARIABLE: 1\nmytool:\n  level: 7\n"
    )
    assert code == 0, err
    assert "ACCEL_MYTOOL_LEVEL=7" in out  # a section of the user's own: variables their script reads
    for variable in ("ACCEL_DEEPSPEED_ZERO_STAGE=2", "ACCEL_FSDP_SHARDING_STRATEGY=FULL_SHARD", "ACCEL_FP8_BACKEND=AO"):
        assert variable in out
    shown = accel_main(["config", "show", "--config-file", str(tmp_path / "config.yaml")])
    assert shown == 0 and "warning" not in capsys.readouterr().out


def test_every_backend_declares_the_options_its_flags_and_plugin_read() -> None:
    """A flag's option is a config option too; and the declared options are exactly what the plugin reads."""
    from accel_core.launch_options import DeclaresConfigOptions
    from accel_deepspeed.plugin import ENV_OPTIONS as DEEPSPEED_OPTIONS
    from accel_deepspeed.plugin import LAUNCHER_ONLY_OPTIONS
    from accel_fsdp.plugin import ENV_OPTIONS as FSDP_OPTIONS
    from accel_launch.extensions import load_extensions
    from accel_megatron.plugin import ENV_OPTIONS as MEGATRON_OPTIONS

    read_by_plugin = {
        "deepspeed": {*DEEPSPEED_OPTIONS, *LAUNCHER_ONLY_OPTIONS},
        "fsdp": set(FSDP_OPTIONS),
        "megatron": set(MEGATRON_OPTIONS),
        "xla": {"device", "downcast_bf16"},
    }
    extensions = {extension.name: extension for extension in load_extensions()}
    assert sorted(extensions) == sorted(read_by_plugin)
    for name, extension in extensions.items():
        assert isinstance(extension, DeclaresConfigOptions), name
        declared = set(extension.config_options())
        assert declared == read_by_plugin[name], name
        assert {option.lower() for _, option, *_ in getattr(extension, "options", ())} <= declared, name


def test_an_accelerate_section_option_accel_does_not_read_is_dropped_with_a_warning() -> None:
    """What `accel config import` writes, `accel launch` takes: an option the strategy would not read is dropped
    (and said), not kept for the launch to refuse."""
    from accel_launch.extensions import check_config_sections, load_extensions

    config, warnings = convert_accelerate_config(
        {
            "distributed_type": "DEEPSPEED",
            "deepspeed_config": {
                "deepspeed_moe_layer_cls_names": "MoEBlock",
                "zero_stage": 2,
                "deepspeed_hostfile": "h",
            },
            "megatron_lm_config": {"megatron_lm_tp_degree": 2, "megatron_lm_bogus": None},
        }
    )
    assert config["deepspeed"] == {"zero_stage": 2, "hostfile": "h"} and config["megatron"] == {"tp_degree": 2}
    assert warnings == [
        "deepspeed_config.deepspeed_moe_layer_cls_names: accel's deepspeed strategy has no such option; dropped."
    ]
    check_config_sections(config, load_extensions(), "converted")  # raises if launch would refuse it


def test_without_an_accel_config_accelerates_default_config_is_read_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An Accelerate user ran `accelerate config` once (8 processes, bf16, FSDP): `accel launch train.py` takes those
    settings, converted, and says where they came from; accel's own default file wins when it exists."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    assert load_config() == ({}, None)  # neither file: no config
    accelerate_file = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    accelerate_file.parent.mkdir(parents=True)
    accelerate_file.write_text(ACCELERATE_FSDP)
    config, path = load_config()
    assert path == accelerate_file and config["num_processes"] == 8 and config["strategy"] == "fsdp"
    assert config["fsdp"]["transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    err = capsys.readouterr().err
    assert f"no accel config file ({tmp_path / 'xdg' / 'accel' / 'default_config.yaml'}); reading Accelerate's" in err
    assert err.count("accel config import") == 2 and len(err.splitlines()) == 1, err  # one note, no second one
    from accel.cli import main as accel_main

    assert accel_main(["config", "show"]) == 0  # shows what the launch reads: the converted Accelerate file
    out = capsys.readouterr().out
    assert "(does not exist: `accel launch` reads Accelerate's default config instead)" in out
    assert f"config file: {accelerate_file} (an Accelerate config file, read as `accel config import`" in out
    assert "num_processes                8           (config file)" in out and "warning" not in out
    write_config(default_config_path(), {"num_processes": 2})
    config, path = load_config()
    assert path == default_config_path() and config["num_processes"] == 2
