"""What several commands share: the launch-setting flags and turning parsed flags into a plan."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accel_core.enums import DynamoBackend, SchedulerStepping
from accel_core.environment import STRATEGY
from accel_core.launch_options import ChecksBeforeLaunch
from accel_launch.config import load_config, write_config
from accel_launch.extensions import LaunchExtension, check_config_sections, extension_env, mesh_over_devices_env
from accel_launch.plan import LaunchPlan, LaunchTarget, parse_env_pairs, resolve_plan, torchrun_argv
from accel_launch.run import direct_command
from accel_launch.settings import SETTINGS
from accel_launch.torchrun_flags import TorchrunFlags

_DEFAULT_PATH_TEXT = "$XDG_CONFIG_HOME/accel/default_config.yaml (~/.config/accel/...)"


def _add(group: argparse._ArgumentGroup, *names: str, dest: str, **kwargs: Any) -> None:
    """Adds ``--dashed-name`` (shown) and Accelerate's ``--underscored_name`` (hidden) for ``dest``."""
    group.add_argument(*names, "--" + dest.replace("_", "-"), dest=dest, default=None, **kwargs)
    if "_" in dest:
        alias = {k: v for k, v in kwargs.items() if k in ("type", "choices", "action")}
        group.add_argument("--" + dest, dest=dest, default=None, help=argparse.SUPPRESS, **alias)


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every launch setting (dest = setting name, default None = not given)."""
    helps = {s.name: s.help for s in SETTINGS}
    layout = parser.add_argument_group("processes and machines")
    layout.add_argument(
        "--cpu", dest="use_cpu", action=argparse.BooleanOptionalAction, default=None, help=helps["use_cpu"]
    )
    layout.add_argument("--use_cpu", dest="use_cpu", action="store_const", const=True, help=argparse.SUPPRESS)
    _add(layout, "-n", dest="num_processes", type=int, metavar="N", help=helps["num_processes"])
    _add(layout, dest="num_machines", metavar="N|MIN:MAX", help=helps["num_machines"])
    _add(
        layout,
        dest="machine_rank",
        type=int,
        metavar="RANK",
        help=helps["machine_rank"] + " (static rendezvous: the node's rank; c10d: machine 0 serves the rendezvous)",
    )
    _add(layout, dest="main_process_ip", metavar="ADDRESS", help=helps["main_process_ip"])
    _add(layout, dest="main_process_port", type=int, metavar="PORT", help="rendezvous port (one machine: a free one)")
    _add(layout, dest="rdzv_backend", metavar="NAME", help=helps["rdzv_backend"])
    _add(layout, dest="rdzv_conf", metavar="KEY=VALUE,...", help=helps["rdzv_conf"])
    _add(layout, dest="max_restarts", type=int, metavar="N", help=helps["max_restarts"])
    layout.add_argument(
        "--keep-global-batch",
        dest="keep_global_batch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=helps["keep_global_batch"],
    )
    layout.add_argument(
        "--auto-resume",
        dest="auto_resume",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=helps["auto_resume"],
    )
    _add(layout, dest="monitor_interval", type=float, metavar="SECONDS", help=helps["monitor_interval"])
    _add(layout, dest="log_dir", metavar="DIR", help=helps["log_dir"])
    _add(layout, "-t", dest="tee", metavar="STREAMS", help=helps["tee"])
    training = parser.add_argument_group("training settings (reach the Accelerator as ACCEL_* variables)")
    _add(training, dest="mixed_precision", choices=["no", "fp16", "bf16", "fp8"], help="mixed precision")
    _add(training, dest="gradient_accumulation_steps", type=int, metavar="N", help=helps["gradient_accumulation_steps"])
    _add(
        training,
        dest="dynamo_backend",
        metavar="NAME",
        help="torch.compile backend: " + ", ".join(DynamoBackend.list()),
    )
    training.add_argument("--strategy", metavar="NAME", help=helps["strategy"])
    _add(training, dest="scheduler_stepping", choices=SchedulerStepping.list(), help=helps["scheduler_stepping"])
    training.add_argument("--debug", action=argparse.BooleanOptionalAction, default=None, help=helps["debug"])
    _add(training, dest="collective_timeout", type=float, metavar="SECONDS", help=helps["collective_timeout"])
    _add(training, dest="stall_report_after", type=float, metavar="SECONDS", help=helps["stall_report_after"])
    mesh = parser.add_argument_group(
        "parallelism (the job's device mesh; unset sizes are 1, the data-parallel one fills the rest)"
    )
    for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "pp_size"):
        _add(mesh, dest=name, type=int, metavar="N", help=helps[name])
        # Accelerate's spelling of the same flags.
        mesh.add_argument(f"--parallelism_config_{name}", dest=name, type=int, default=None, help=argparse.SUPPRESS)
    _add(mesh, dest="pp_schedule", choices=("gpipe", "1f1b", "interleaved_1f1b"), help=helps["pp_schedule"])
    _add(mesh, dest="pp_microbatches", type=int, metavar="N", help=helps["pp_microbatches"])
    launcher = parser.add_argument_group("launcher")
    _add(launcher, dest="config_file", metavar="PATH", help="default: $ACCEL_CONFIG_FILE, else " + _DEFAULT_PATH_TEXT)
    launcher.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="a variable for every process (repeatable)"
    )


def plan_from_namespace(
    namespace: argparse.Namespace,
    extensions: Sequence[LaunchExtension] = (),
    defaults: dict[str, Any] | None = None,
    flag_variables: dict[str, str] | None = None,
    torchrun: TorchrunFlags | None = None,
) -> LaunchPlan:
    """Resolves the plan from parsed flags, ``os.environ`` and the config file. ``flag_variables``: variables other
    flags stand for (Accelerate's, accel_launch.accelerate_flags), below the ``--env`` pairs; ``torchrun``: what
    torchrun's flags asked for beyond accel's settings (accel_launch.torchrun_flags)."""
    config, path = load_config(namespace.config_file)
    check_config_sections(config, extensions, str(path) if path else None)
    flags = {s.name: getattr(namespace, s.name, None) for s in SETTINGS}
    flag_env = {**extension_env(extensions, namespace), **(flag_variables or {}), **parse_env_pairs(namespace.env)}
    # The strategy the workers will run (flag, then environment, then config file) may count its mesh in devices.
    strategy = flag_env.get(STRATEGY) or flags.get("strategy") or os.environ.get(STRATEGY) or config.get("strategy")
    flag_env = {**mesh_over_devices_env(extensions, strategy), **flag_env}
    plan = resolve_plan(
        flags,
        os.environ,
        config,
        flag_env=flag_env,
        defaults=defaults,
        config_file=str(path) if path else None,
        processes_per_machine=torchrun.processes_per_machine if torchrun else None,
    )
    if torchrun and torchrun.torchrun_options:
        plan = dataclasses.replace(plan, torchrun_options=torchrun.torchrun_options)
    check_strategy(plan)
    check_precision(plan)
    for extension in extensions:  # the backend's own installation check (torch-xla built for another torch, say)
        if extension.name == strategy and isinstance(extension, ChecksBeforeLaunch):
            extension.check_before_launch()
    return plan


# Strategies accel-core builds itself; the others come from `accel.strategies` entry points.
BUILTIN_STRATEGIES = ("ddp", "single_device")


def check_strategy(plan: LaunchPlan) -> None:
    """Fails before starting anything when the chosen strategy's package is not installed."""
    name = plan.strategy
    if not name or name in BUILTIN_STRATEGIES:
        return
    from accel_core import discovery  # entry-point scan: only when a strategy is named

    installed = discovery.available("accel.strategies")
    if name not in installed:
        raise ValueError(
            f"strategy {name!r} (from the {plan.sources['strategy']}) is not installed: "
            f"{discovery.install_hint('accel.strategies', name)}. Available: "
            f"{', '.join([*BUILTIN_STRATEGIES, *installed])}."
        )


def check_precision(plan: LaunchPlan) -> None:
    """Fails before starting anything when ``mixed_precision`` needs a package that is not installed (fp8's);
    otherwise every worker would import torch, then stop with the same message."""
    if plan.mixed_precision != "fp8":
        return
    from accel_core import discovery  # entry-point scan: only for fp8

    if not discovery.is_available("accel.precisions", "fp8"):
        raise ValueError(
            f"mixed_precision fp8 (from the {plan.sources['mixed_precision']}) needs accel-fp8, which is not "
            f"installed: {discovery.install_hint('accel.precisions', 'fp8')}."
        )


def format_settings(plan: LaunchPlan) -> str:
    """One line per setting: value and where it came from."""
    width = max(len(s.name) for s in SETTINGS)
    lines = []
    values = plan.settings()
    for setting in SETTINGS:
        value = values[setting.name]
        shown = "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        source = plan.sources.get(setting.name, "?")
        if setting.name == "rdzv_backend" and plan.num_machines == 1 and not plan.elastic:
            # One machine always meets at c10d (accel_launch.rendezvous): show what runs, and why.
            shown, source = "c10d", f"{source}; one machine: always c10d"
        lines.append(f"  {setting.name.ljust(width)}  {shown.ljust(10)}  ({source})")
    return "\n".join(lines)


def format_command(plan: LaunchPlan, target: LaunchTarget) -> str:
    """The equivalent command line: ``torchrun ...`` or ``python ...``."""
    if plan.uses_torchrun:
        words = [sys.executable, "-m", "torch.distributed.run", *torchrun_argv(plan, target)]
    else:
        words = direct_command(target)
    return shlex.join(words)


def format_env(variables: dict[str, str]) -> str:
    if not variables:
        return "  (none)"
    return "\n".join(f"  {key}={value}" for key, value in sorted(variables.items()))


def write_config_file(path: Path, config: dict[str, Any], flag: str = "--config-file") -> Path:
    """``write_config``, with a path that cannot be written reported as the user's error to fix (``flag``
    names the option that chose the path)."""
    try:
        return write_config(path, config)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ValueError(
            f"cannot write the config file {path} ({reason}): pass {flag} with a path in a folder you can write to."
        ) from None
