"""``accel test``: launches ``accel.check_script`` with the current config and prints PASS or FAIL."""

from __future__ import annotations

import argparse
import sys

from accel_core.launch.extensions import add_extension_arguments, load_extensions
from accel_core.launch.failures import JobFailedError
from accel_core.launch.plan import LaunchTarget
from accel_core.launch.run import launch

from .common import add_settings_arguments, plan_from_namespace

# Without a config file or flags, check the part every machine has: two CPU processes over gloo.
DEFAULTS = {"num_processes": 2, "use_cpu": True}
TARGET = LaunchTarget("accel.check_script", module=True)


def main(argv: list[str]) -> int:
    extensions = load_extensions()
    parser = argparse.ArgumentParser(
        prog="accel test",
        description="Launches a built-in check (collectives and a data-parallel training step) with the current "
        "config; without one, on 2 CPU processes. Flags override the config as in `accel launch`.",
    )
    add_settings_arguments(parser)
    add_extension_arguments(parser, extensions)
    plan = plan_from_namespace(parser.parse_args(argv), extensions, defaults=DEFAULTS)
    device = "cpu" if plan.use_cpu else "default device"
    where = f"{plan.num_processes} process(es) on {plan.num_machines} machine(s), {device}"
    print(f"accel test: running accel.check_script on {where}, mixed precision {plan.mixed_precision}", flush=True)
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
