"""``accel test``: launches ``accel.check_script`` with the current config and prints PASS or FAIL."""

from __future__ import annotations

import argparse
import sys

from accel_core import environment as env
from accel_launch.extensions import LaunchExtension, add_extension_arguments, load_extensions
from accel_launch.failures import JobFailedError
from accel_launch.plan import LaunchPlan, LaunchTarget
from accel_launch.run import launch
from accel_launch.settings import CONFIG, DEFAULT

from .common import add_settings_arguments, plan_from_namespace

# Without a config file or flags, check the part every machine has: two CPU processes over gloo.
DEFAULTS = {"num_processes": 2, "use_cpu": True}
TARGET = LaunchTarget("accel.check_script", module=True)


def build_parser(extensions: list[LaunchExtension]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel test",
        # The options are accel launch's settings: listing them all in every error message buries the error.
        usage="accel test [options]   (the settings of `accel launch`; `accel test --help` lists them)",
        description="Launches a built-in check (collectives, data sharding and a training step checked against the "
        "same step by hand) with the current config and its strategy (DDP, FSDP, DeepSpeed: the config file's or "
        "the flags', e.g. `accel test --use_fsdp`); without a config, on 2 CPU processes. A config of one CPU "
        "process (what `accel config default` writes on a machine without GPUs) is checked on 2, so that the "
        "multi-process part runs; `-n 1` checks one. Flags override the config as in `accel launch`.",
    )
    add_settings_arguments(parser)
    add_extension_arguments(parser, extensions)
    return parser


def _runs_one_cpu_process_by_config(plan: LaunchPlan) -> bool:
    """One CPU process on one machine, not asked for by a flag or the environment: nothing multi-process to check."""
    unasked = plan.sources.get("num_processes") in (CONFIG, DEFAULT)
    return plan.use_cpu and plan.num_processes == 1 and plan.num_machines == 1 and unasked


def main(argv: list[str]) -> int:
    extensions = load_extensions()
    namespace = build_parser(extensions).parse_args(argv)
    plan = plan_from_namespace(namespace, extensions, defaults=DEFAULTS)
    if _runs_one_cpu_process_by_config(plan):
        namespace.num_processes = DEFAULTS["num_processes"]
        plan = plan_from_namespace(namespace, extensions, defaults=DEFAULTS)
        print(
            f"accel test: the config file ({plan.config_file}) runs one CPU process; checking on "
            f"{plan.num_processes} so that the multi-process part runs too (`accel test -n 1` checks one).",
            flush=True,
        )
    device = "cpu" if plan.use_cpu else "default device"
    where = f"{plan.num_processes} process(es) on {plan.num_machines} machine(s), {device}"
    strategy = plan.strategy or plan.env.get(env.STRATEGY) or "automatic (DDP on several processes)"
    print(
        f"accel test: running accel.check_script on {where}, mixed precision {plan.mixed_precision}, "
        f"strategy {strategy}",
        flush=True,
    )
    try:
        code = launch(plan, TARGET)
    except JobFailedError as failure:
        print(f"accel test: {failure}", file=sys.stderr)
        code = failure.exit_code
    if code == 0:
        print("accel test: PASS")
    else:
        print(f"accel test: FAIL (exit code {code}); `accel env` prints what to attach to a bug report.")
    return code
