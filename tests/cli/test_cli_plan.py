"""The launch plan: precedence flag > environment > config file > default, checks, torchrun arguments."""

from __future__ import annotations

import argparse
import re
import signal
from dataclasses import replace

import pytest

from accel.commands.common import format_settings
from accel_launch.extensions import add_extension_arguments, extension_env, load_extensions
from accel_launch.failures import JobFailedError, RankFailure, drop_wrapper_frames
from accel_launch.plan import LaunchTarget, parse_env_pairs, resolve_plan, torchrun_argv
from accel_launch.rendezvous import warning as rendezvous_warning
from accel_launch.settings import CONFIG, DEFAULT, ENVIRONMENT, FLAG


def test_each_setting_takes_flag_then_environment_then_config_then_default() -> None:
    config = {
        "mixed_precision": "fp16",
        "gradient_accumulation_steps": 3,
        "dynamo_backend": "inductor",
        "num_processes": 4,
    }
    environ = {"ACCEL_MIXED_PRECISION": "bf16", "ACCEL_GRADIENT_ACCUMULATION_STEPS": "5"}
    flags = {"mixed_precision": "fp8", "num_processes": None, "use_cpu": None}
    plan = resolve_plan(flags, environ, config)
    assert (plan.mixed_precision, plan.sources["mixed_precision"]) == ("fp8", FLAG)
    assert (plan.gradient_accumulation_steps, plan.sources["gradient_accumulation_steps"]) == (5, ENVIRONMENT)
    assert (plan.dynamo_backend, plan.sources["dynamo_backend"]) == ("inductor", CONFIG)
    assert (plan.num_processes, plan.sources["num_processes"]) == (4, CONFIG)
    assert (plan.use_cpu, plan.sources["use_cpu"]) == (False, DEFAULT)
    # The workers see the resolved values, whatever their source.
    assert plan.env["ACCEL_MIXED_PRECISION"] == "fp8"
    assert plan.env["ACCEL_GRADIENT_ACCUMULATION_STEPS"] == "5"
    assert plan.env["ACCEL_DYNAMO_BACKEND"] == "inductor"
    assert plan.env["ACCEL_USE_CPU"] == "false"
    assert "ACCEL_STRATEGY" not in plan.env  # automatic: the Accelerator decides


def test_layout_settings_have_no_environment_step_and_empty_environment_values_do_not_count() -> None:
    plan = resolve_plan({}, {"ACCEL_MIXED_PRECISION": "", "NUM_PROCESSES": "8"}, {"mixed_precision": "bf16"})
    assert plan.mixed_precision == "bf16" and plan.num_processes == 1


def test_false_flags_override_a_true_config_and_defaults_can_be_replaced() -> None:
    plan = resolve_plan({"use_cpu": False, "debug": False}, {}, {"use_cpu": True, "debug": True})
    assert (plan.use_cpu, plan.debug) == (False, False)
    plan = resolve_plan({}, {}, {}, defaults={"num_processes": 2, "use_cpu": True})
    assert (plan.num_processes, plan.use_cpu, plan.sources["num_processes"]) == (2, True, DEFAULT)
    plan = resolve_plan({}, {}, {"num_processes": 1}, defaults={"num_processes": 2})
    assert plan.num_processes == 1  # a config beats a command's own default


def test_yaml_bare_no_and_environment_booleans_are_read() -> None:
    # YAML 1.1 reads `mixed_precision: no` as False.
    plan = resolve_plan(
        {}, {"ACCEL_USE_CPU": "1", "ACCEL_DEBUG_MODE": "yes"}, {"mixed_precision": False, "dynamo_backend": False}
    )
    assert (plan.mixed_precision, plan.dynamo_backend, plan.use_cpu, plan.debug) == ("no", "no", True, True)


@pytest.mark.parametrize(
    ("flags", "environ", "config", "message"),
    [
        ({}, {"ACCEL_MIXED_PRECISION": "fp12"}, {}, "environment variable ACCEL_MIXED_PRECISION"),
        ({}, {}, {"gradient_accumulation_steps": "many"}, "key 'gradient_accumulation_steps'"),
        ({"num_processes": 3, "num_machines": 2, "main_process_ip": "10.0.0.1"}, {}, {}, "multiple of num_machines"),
        ({"num_machines": "1:2", "main_process_ip": "h"}, {}, {}, "all 2 \\(MAX\\) machines.*--num-processes 2"),
        ({"num_machines": "3:2", "num_processes": 2, "main_process_ip": "h"}, {}, {}, "1 <= MIN <= MAX"),
        ({"num_machines": "1:2", "num_processes": 2}, {}, {}, "elastic job.*--main-process-ip"),
        ({"num_machines": "two"}, {}, {}, "--num-machines: expected a number of machines N or a range MIN:MAX"),
        ({}, {}, {"num_machines": "1:x"}, "key 'num_machines'.*MIN:MAX"),
        (
            {"num_machines": "1:2", "num_processes": 2, "main_process_ip": "h", "rdzv_backend": "static"},
            {},
            {},
            "static rendezvous fixes the number of machines.*--rdzv-backend c10d",
        ),
        ({"num_machines": 2, "num_processes": 2, "machine_rank": 2, "main_process_ip": "h"}, {}, {}, "machine_rank"),
        ({"num_machines": 2, "num_processes": 2}, {}, {}, "--main-process-ip"),
        ({"num_processes": 0}, {}, {}, "at least 1"),
        ({"main_process_port": 70000}, {}, {}, "not a TCP port"),
        ({}, {"ACCEL_USE_CPU": "maybe"}, {}, "ACCEL_USE_CPU"),
        ({"tee": "4"}, {}, {}, "tee='4'; use 0 \\(none\\)"),
        ({}, {}, {"tee": "0:3,x"}, "key 'tee'.*per local rank"),
    ],
)
def test_wrong_settings_name_where_they_came_from(flags, environ, config, message) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_plan(flags, environ, config)


def test_worker_environment_layers_config_sections_environment_and_command_line() -> None:
    config = {
        "env": {"FROM_CONFIG": "c", "SHARED": "config", "COUNT": 3},
        "fsdp": {"sharding_strategy": "FULL_SHARD", "offload_params": True, "layers": ["Block", "Head"]},
        "deepspeed": {"zero_stage": 2, "hostfile": None},
    }
    environ = {"SHARED": "shell", "ACCEL_FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"}
    plan = resolve_plan({}, environ, config, flag_env={"FROM_FLAG": "f", "ACCEL_DEEPSPEED_ZERO_STAGE": "3"})
    assert plan.env["FROM_CONFIG"] == "c" and plan.env["COUNT"] == "3"
    assert "SHARED" not in plan.env  # the shell's value stays
    assert "ACCEL_FSDP_SHARDING_STRATEGY" not in plan.env  # environment beats config
    assert plan.env["ACCEL_FSDP_OFFLOAD_PARAMS"] == "true"
    assert plan.env["ACCEL_FSDP_LAYERS"] == '["Block", "Head"]'
    assert plan.env["ACCEL_DEEPSPEED_ZERO_STAGE"] == "3"  # command line beats config
    assert "ACCEL_DEEPSPEED_HOSTFILE" not in plan.env
    assert plan.env["FROM_FLAG"] == "f"


def test_omp_threads_share_the_cpus_unless_the_caller_chose() -> None:
    plan = resolve_plan({"num_processes": 4}, {}, {}, cpu_count=16)
    assert plan.env["OMP_NUM_THREADS"] == "4"
    assert resolve_plan({"num_processes": 4}, {}, {}, cpu_count=2).env["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in resolve_plan({"num_processes": 4}, {"OMP_NUM_THREADS": "8"}, {}).env
    assert "OMP_NUM_THREADS" not in resolve_plan({}, {}, {}).env  # one process: leave torch's default


def test_debug_mode_turns_on_torchs_collective_checks_unless_the_caller_chose() -> None:
    assert resolve_plan({"debug": True}, {}, {}).env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert "TORCH_DISTRIBUTED_DEBUG" not in resolve_plan({"debug": True}, {"TORCH_DISTRIBUTED_DEBUG": "INFO"}, {}).env
    assert "TORCH_DISTRIBUTED_DEBUG" not in resolve_plan({}, {}, {}).env


def test_env_pairs() -> None:
    assert parse_env_pairs(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_env_pairs(["NOVALUE"])


def test_when_torchrun_is_used() -> None:
    assert not resolve_plan({}, {}, {}).uses_torchrun
    assert resolve_plan({"num_processes": 2}, {}, {}).uses_torchrun
    assert resolve_plan({"max_restarts": 1}, {}, {}).uses_torchrun
    assert resolve_plan({"log_dir": "logs"}, {}, {}).uses_torchrun  # torchrun writes the log files
    assert resolve_plan({"num_machines": 2, "num_processes": 2, "main_process_ip": "h"}, {}, {}).uses_torchrun


def test_torchrun_arguments() -> None:
    target = LaunchTarget("train.py", ("--lr", "1"))
    one = torchrun_argv(resolve_plan({"num_processes": 2}, {}, {}), target)
    assert one == [
        "--nnodes=1",
        "--nproc-per-node=2",
        "-m",
        "accel_launch.runner",
        "path",
        "train.py",
        "--lr",
        "1",
    ]
    port = torchrun_argv(
        resolve_plan({"num_processes": 2, "main_process_port": 1234, "max_restarts": 2}, {}, {}), target
    )
    # This agent serves the store: a store another job serves on that port is an error, not a job to join.
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1234", "--rdzv-conf=is_host=true"} <= set(port)
    assert "--max-restarts=2" in port
    conf = resolve_plan({"num_processes": 2, "main_process_port": 1234, "rdzv_conf": "join_timeout=9"}, {}, {})
    assert "--rdzv-conf=join_timeout=9,is_host=true" in torchrun_argv(conf, target)
    own = resolve_plan({"num_processes": 2, "main_process_port": 1234, "rdzv_conf": "is_host=false"}, {}, {})
    assert "--rdzv-conf=is_host=false" in torchrun_argv(own, target)
    flags = {
        "num_processes": 16,
        "num_machines": 2,
        "machine_rank": 1,
        "main_process_ip": "10.0.0.1",
        "monitor_interval": 0.5,
    }
    static = torchrun_argv(resolve_plan(flags, {}, {}), LaunchTarget("pkg.train", module=True))
    assert static[:2] == ["--nnodes=2", "--nproc-per-node=8"]
    assert {"--node-rank=1", "--master-addr=10.0.0.1", "--master-port=29500", "--monitor-interval=0.5"} <= set(static)
    assert static[-3:] == ["accel_launch.runner", "module", "pkg.train"]
    c10d = torchrun_argv(resolve_plan({**flags, "rdzv_backend": "c10d", "main_process_port": 4000}, {}, {}), target)
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:4000"} <= set(c10d)
    assert not any(arg.startswith("--node-rank") for arg in c10d)
    logged = torchrun_argv(resolve_plan({"num_processes": 2, "log_dir": "logs"}, {}, {}), target)
    assert {"--log-dir=logs", "--tee=3"} <= set(logged)  # a log folder gets both streams unless --tee says
    teed = torchrun_argv(resolve_plan({"num_processes": 2}, {}, {"log_dir": "logs", "tee": "0:3,1:2"}), target)
    assert {"--log-dir=logs", "--tee=0:3,1:2"} <= set(teed)


def test_the_agents_error_files_go_to_the_launchs_own_folder_unless_output_is_kept() -> None:
    # torch's agent makes a torchelastic_* folder in /tmp per job and never removes it; accel gives it one inside
    # the folder its launch removes, except where the agent is asked to keep the workers' output there.
    target = LaunchTarget("train.py")
    plain = torchrun_argv(resolve_plan({"num_processes": 2}, {}, {}), target, scratch="/tmp/accel-finished-1-x")
    assert "--log-dir=/tmp/accel-finished-1-x/agent" in plain
    kept = [
        resolve_plan({"num_processes": 2, "log_dir": "logs"}, {}, {}),
        resolve_plan({"num_processes": 2, "tee": "3"}, {}, {}),
        replace(resolve_plan({"num_processes": 2}, {}, {}), torchrun_options=("--redirects=3",)),
    ]
    for plan in kept:
        argv = torchrun_argv(plan, target, scratch="/tmp/accel-finished-1-x")
        assert not any("accel-finished" in arg for arg in argv), argv


class _Precision:
    """A real (small) implementation of the extension interface, as a backend package would write it."""

    name = "toy"

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--toy-level", dest="toy_level", type=int, default=None)
        group.add_argument("--use-toy", dest="use_toy", action="store_true", default=None)

    def to_env(self, namespace: argparse.Namespace) -> dict[str, str]:
        result = {} if namespace.toy_level is None else {"ACCEL_TOY_LEVEL": str(namespace.toy_level)}
        if namespace.use_toy:
            result["ACCEL_STRATEGY"] = "toy"
        return result


class _Broken(_Precision):
    name = "broken"

    def to_env(self, namespace: argparse.Namespace) -> dict[str, str]:
        return {"ACCEL_BROKEN": 3}  # type: ignore[dict-item]  # the wrong type is what the test checks


def test_backend_flags_come_from_extensions() -> None:
    parser = argparse.ArgumentParser()
    add_extension_arguments(parser, [_Precision()])
    assert "toy options" in parser.format_help() and "--toy-level" in parser.format_help()
    namespace = parser.parse_args(["--toy-level", "3", "--use-toy"])
    assert extension_env([_Precision()], namespace) == {"ACCEL_TOY_LEVEL": "3", "ACCEL_STRATEGY": "toy"}
    assert extension_env([_Precision()], parser.parse_args([])) == {}
    with pytest.raises(TypeError, match="must be strings"):
        extension_env([_Broken()], namespace)


def test_conflicting_or_missing_extensions_are_skipped_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_extension_arguments(parser, [_Precision(), _Precision()])  # the second one's flags collide
    assert "ignoring the flags of 'toy'" in capsys.readouterr().err
    assert load_extensions(["no-such-backend"]) == []
    assert "no-such-backend" in capsys.readouterr().err


def _failure(rank: int, exitcode: int, traceback: str | None = None, timestamp: int = 100) -> RankFailure:
    return RankFailure(
        rank=rank, local_rank=rank, exitcode=exitcode, pid=1000 + rank, timestamp=timestamp, traceback=traceback
    )


def test_the_root_cause_is_the_rank_that_failed_by_itself() -> None:
    stopped = _failure(0, -signal.SIGTERM.value, timestamp=99)
    error = JobFailedError([stopped, _failure(3, 1, "Traceback ...\nValueError: boom\n")], world_size=4)
    assert error.root.rank == 3 and error.exit_code == 1
    text = str(error)
    assert text.startswith("The job failed: rank 3 (local rank 3, pid 1003) exited with code 1.")
    assert "ValueError: boom" in text and "The other ranks were stopped." in text and "rank 0" not in text
    assert JobFailedError([_failure(1, 7)]).exit_code == 7
    killed = JobFailedError([_failure(1, -signal.SIGSEGV.value)], world_size=1)
    assert killed.exit_code == 128 + signal.SIGSEGV.value and "killed by SIGSEGV" in str(killed)
    assert "other ranks" not in str(killed)


def test_torch_wrapper_frames_are_dropped_from_tracebacks() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 384, in wrapper\n'
        "    result = f(*args, **kwargs)\n"
        "             ^^^^^^^^^^^^^^^^^^\n"
        '  File "/home/me/train.py", line 3, in step\n'
        "    raise KeyError(1)\n"
        "KeyError: 1\n"
    )
    assert drop_wrapper_frames(text) == (
        'Traceback (most recent call last):\n  File "/home/me/train.py", line 3, in step\n    raise '
        "KeyError(1)\nKeyError: 1\n"
    )


def test_option_table_extension_parses_both_spellings_and_selects_the_backend():
    import argparse as _argparse

    from accel_core.launch_options import OptionTable, bool_text, choice_text, nonnegative_int_text

    class ToyOptions(OptionTable):
        name = "toy"
        options = (
            ("toy-level", "LEVEL", nonnegative_int_text, "N", "how much"),
            ("toy-mode", "MODE", choice_text(("FAST", "SLOW")), "NAME", "which"),
            ("toy-flag", "FLAG", bool_text, "BOOL", "on or off"),
        )

    parser = _argparse.ArgumentParser()
    ToyOptions().add_arguments(parser.add_argument_group("toy options"))
    env = ToyOptions().to_env(parser.parse_args(["--toy_level", "1e3", "--toy-mode", "2", "--toy-flag", "Yes"]))
    assert env == {
        "ACCEL_TOY_LEVEL": "1000",
        "ACCEL_TOY_MODE": "SLOW",
        "ACCEL_TOY_FLAG": "true",
        "ACCEL_STRATEGY": "toy",
    }
    assert ToyOptions().to_env(parser.parse_args([])) == {}
    assert ToyOptions().to_env(parser.parse_args(["--use-toy"])) == {"ACCEL_STRATEGY": "toy"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--toy-level", "-1"])


def test_scheduler_stepping_travels_from_flag_environment_or_config_file() -> None:
    plan = resolve_plan({}, {}, {})
    assert plan.scheduler_stepping is None and "ACCEL_SCHEDULER_STEPPING" not in plan.env  # the Accelerator's default
    plan = resolve_plan({}, {}, {"scheduler_stepping": "per_optimizer_step"})
    assert (plan.env["ACCEL_SCHEDULER_STEPPING"], plan.sources["scheduler_stepping"]) == ("per_optimizer_step", CONFIG)
    plan = resolve_plan({"scheduler_stepping": "per_process"}, {"ACCEL_SCHEDULER_STEPPING": "per_optimizer_step"}, {})
    assert plan.env["ACCEL_SCHEDULER_STEPPING"] == "per_process"
    with pytest.raises(ValueError, match=r"scheduler_stepping.*per_optimizer_step"):
        resolve_plan({}, {}, {"scheduler_stepping": "per_epoch"})


def test_several_machines_with_restarts_or_an_elastic_size_meet_at_a_c10d_rendezvous() -> None:
    """The static rendezvous cannot take a lost machine's agent back (its restarted workers read the lost attempt's
    addresses) nor change the number of machines: restarts and MIN:MAX choose c10d unless a backend is named."""
    target = LaunchTarget("train.py")
    two = {"num_machines": 2, "num_processes": 2, "main_process_ip": "127.0.0.1", "main_process_port": 4000}
    assert resolve_plan(two, {}, {}).rdzv_backend == "static"  # no restarts: node ranks as given
    restarting = resolve_plan({**two, "max_restarts": 2, "machine_rank": 1}, {}, {})
    argv = torchrun_argv(restarting, target)
    assert restarting.rdzv_backend == "c10d" and rendezvous_warning(restarting) is None
    # A machine rank given says which agent serves the store (on one machine's loopback every agent would guess so).
    assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:4000", "--rdzv-conf=is_host=false"} <= set(
        argv
    )
    assert "--rdzv-conf=is_host=true" in torchrun_argv(
        resolve_plan({**two, "max_restarts": 2, "machine_rank": 0}, {}, {}), target
    )
    assert not any("is_host" in arg for arg in torchrun_argv(resolve_plan({**two, "max_restarts": 2}, {}, {}), target))
    static = resolve_plan({**two, "max_restarts": 2}, {}, {"rdzv_backend": "static"})  # asked for: kept, with a warning
    assert static.rdzv_backend == "static"
    assert "cannot rejoin" in (rendezvous_warning(static) or "") and "config key 'rdzv_backend'" in (
        rendezvous_warning(static) or ""
    )


def test_rendezvous_settings_reach_torchrun_next_to_the_hosts_own() -> None:
    """``--rdzv-conf`` (Accelerate's ``--rdzv_conf``) is torchrun's KEY=VALUE list, joined with the ``is_host`` accel
    sets; malformed text and settings for a static rendezvous of several machines are refused with the fix."""
    target = LaunchTarget("train.py")
    elastic = {"num_machines": "1:2", "num_processes": 2, "main_process_ip": "127.0.0.1", "machine_rank": 1}
    argv = torchrun_argv(resolve_plan({**elastic, "rdzv_conf": "last_call_timeout=3"}, {}, {}), target)
    assert "--rdzv-conf=last_call_timeout=3,is_host=false" in argv
    one = torchrun_argv(resolve_plan({"num_processes": 2, "main_process_port": 4000}, {}, {"rdzv_conf": "a=1"}), target)
    assert "--rdzv-conf=a=1,is_host=true" in one
    with pytest.raises(ValueError, match="'oops' is not KEY=VALUE"):
        resolve_plan({"num_processes": 2, "rdzv_conf": "a=1,oops"}, {}, {})
    two = {"num_machines": 2, "num_processes": 2, "main_process_ip": "127.0.0.1", "rdzv_conf": "a=1"}
    with pytest.raises(ValueError, match="static rendezvous of several machines takes no settings"):
        resolve_plan(two, {}, {})


def test_one_machine_meets_at_c10d_whatever_rdzv_backend_says() -> None:
    """One machine: torchrun's c10d on its own free port, or on --main-process-port. ``rdzv_backend: static`` (which
    every config file carries by default, Accelerate's too) does not bring back the static rendezvous there: its one
    store for every attempt breaks restarts of process groups set up outside accel."""
    target = LaunchTarget("train.py")
    for config in ({}, {"rdzv_backend": "static"}):
        free = torchrun_argv(resolve_plan({"num_processes": 2}, {}, config), target)
        assert not any("rdzv" in arg or "master" in arg for arg in free)
        port = torchrun_argv(resolve_plan({"num_processes": 2, "main_process_port": 4000}, {}, config), target)
        assert {"--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:4000"} <= set(port)
        # --dry-run's table shows what runs (it said "static" here).
        shown = format_settings(resolve_plan({"num_processes": 2}, {}, config))
        assert re.search(r"rdzv_backend +c10d +\((default|config file); one machine: always c10d\)", shown), shown
        assert not any(arg.startswith(("--master", "--node-rank")) for arg in port)
        conf = torchrun_argv(resolve_plan({"num_processes": 2, "rdzv_conf": "a=1"}, {}, config), target)
        assert "--rdzv-conf=a=1" in conf
    restarting = resolve_plan({"num_processes": 2, "max_restarts": 1}, {}, {"rdzv_backend": "static"})
    assert rendezvous_warning(restarting) is None


def test_an_elastic_job_counts_its_processes_over_max_machines_and_may_keep_the_global_batch() -> None:
    flags = {"num_machines": "1:2", "num_processes": 4, "main_process_ip": "10.0.0.1", "keep_global_batch": True}
    plan = resolve_plan(flags, {}, {})
    assert (plan.min_machines, plan.num_machines, plan.nproc_per_node, plan.elastic) == (1, 2, 2, True)
    assert plan.rdzv_backend == "c10d" and plan.settings()["num_machines"] == "1:2"
    assert plan.env["ACCEL_GLOBAL_BATCH_PROCESSES"] == "4"  # the world the accumulation is meant for
    argv = torchrun_argv(plan, LaunchTarget("train.py"))
    assert {"--nnodes=1:2", "--nproc-per-node=2", "--rdzv-endpoint=10.0.0.1:29500"} <= set(argv)
    fixed = resolve_plan({"num_machines": "2:2", "num_processes": 4, "main_process_ip": "h"}, {}, {})
    assert (fixed.min_machines, fixed.elastic, fixed.rdzv_backend) == (None, False, "static")
    assert "ACCEL_GLOBAL_BATCH_PROCESSES" not in resolve_plan({**flags, "keep_global_batch": False}, {}, {}).env
    assert "--max-restarts N" in (rendezvous_warning(plan) or "")  # no restarts: a lost machine ends the job
    assert rendezvous_warning(resolve_plan({**flags, "max_restarts": 2}, {}, {})) is None


def test_keep_global_batch_multiplies_the_accumulation_of_a_smaller_world() -> None:
    from accel_core.strategies import resolve_strategy_plan

    environ = {"ACCEL_GLOBAL_BATCH_PROCESSES": "4", "ACCEL_GRADIENT_ACCUMULATION_STEPS": "3"}
    assert resolve_strategy_plan(world_size=4, environ=environ).gradient_accumulation.num_steps == 3
    assert resolve_strategy_plan(world_size=2, environ=environ).gradient_accumulation.num_steps == 6
    assert (
        resolve_strategy_plan(
            world_size=1, gradient_accumulation_steps=2, environ=environ
        ).gradient_accumulation.num_steps
        == 8
    )
    with pytest.raises(ValueError, match="3 processes of this round cannot keep the global batch of 4"):
        resolve_strategy_plan(world_size=3, environ=environ)
