"""``accel launch [options] script.py [args]`` / ``accel launch [options] -m package.module [args]``."""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
from typing import Any, NoReturn

from accel_launch.accelerate_flags import RefusedFlagError, accelerate_flags_env, add_accelerate_flags
from accel_launch.extensions import LaunchExtension, add_extension_arguments, load_extensions
from accel_launch.failures import JobFailedError, RendezvousLostError
from accel_launch.plan import LaunchTarget
from accel_launch.run import launch
from accel_launch.torchrun_flags import TorchrunFlagError, add_torchrun_flags, apply_torchrun_flags

from .common import add_settings_arguments, format_command, format_env, format_settings, plan_from_namespace

DESCRIPTION = """Runs a training script on one or many processes and machines.

Several processes (or machines, or --max-restarts) go through torchrun's elastic agent; one
process runs the script directly. Each setting comes from, in order: this command's flags, an
ACCEL_* variable already in the environment, the config file, the default."""

EPILOG = """examples:
  accel launch --cpu -n 2 train.py --epochs 3
  accel launch -n 8 --mixed-precision bf16 -m mypackage.train
  accel launch --num-machines 2 --machine-rank 0 --main-process-ip 10.0.0.1 -n 16 train.py
  accel launch --num-machines 1:4 --main-process-ip 10.0.0.1 -n 32 --max-restarts 3 --auto-resume train.py
      (elastic: 1 to 4 machines of 8 processes; -n counts all 4 machines' processes)

torchrun's and Accelerate's launch flags work too (--nproc-per-node 8, --multi_gpu, ...): each is
accel's setting under another name, passed on to torchrun's agent, or answered with what to do."""


class _LaunchParser(argparse.ArgumentParser):
    """argparse's parser that names the closest flag for a misspelt one (``--num_proceses``)."""

    def error(self, message: str) -> NoReturn:
        unknown = "unrecognized arguments: "
        if message.startswith(unknown):
            flags = [name for name in self._option_string_actions if name.startswith("--")]
            hints = []
            for word in message.removeprefix(unknown).split():
                name = word.split("=", 1)[0]
                close = difflib.get_close_matches(name, flags, n=1) if name.startswith("--") else []
                if close:
                    hints.append(f"{name}: did you mean {close[0]}?")
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)


def build_parser(extensions: list[LaunchExtension]) -> argparse.ArgumentParser:
    parser = _LaunchParser(
        prog="accel launch",
        usage="accel launch [options] script.py [args ...]\n       accel launch [options] -m package.module [args ...]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # A script's own flag after the script (`-m pkg --x`) must reach the script, not be read as an abbreviation
        # of a launcher flag (--xla-device); launcher flags are spelled out, as torchrun's are.
        allow_abbrev=False,
    )
    parser.add_argument("-m", "--module", action="store_true", help="run a module, like `python -m`")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the command, start nothing")
    add_settings_arguments(parser)
    add_extension_arguments(parser, extensions)
    add_accelerate_flags(parser)  # hidden: Accelerate's launch lines run unchanged, or say why not
    add_torchrun_flags(parser)  # hidden, as torchrun's launch lines
    # Optional to argparse, required below: its own message would also call the script's arguments required.
    parser.add_argument("script", nargs="?", help="the training script (or module, with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


class LaunchUsageError(ValueError):
    """A launch line that cannot run as given (no script, a refused flag); the message says what to do."""


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of ``accel launch`` (Accelerate's ``launch_command_parser``): ``parse_args([...flags, "train.py",
    ...script args])`` gives what ``launch_command`` runs. With ``subparsers`` (an argparse subparsers action) it is
    added there as the ``launch`` command."""
    parser = build_parser(load_extensions())
    if subparsers is None:
        return parser
    command = subparsers.add_parser(
        "launch", parents=[parser], add_help=False, description=DESCRIPTION, allow_abbrev=False
    )
    command.set_defaults(func=launch_command)
    return command


def launch_command(args: argparse.Namespace) -> None:
    """Runs the launch ``launch_command_parser().parse_args(...)`` describes (Accelerate's ``launch_command``, as TRL's
    command line calls it). Raises ``subprocess.CalledProcessError`` when the job fails, ``ValueError`` for a launch
    line that cannot run.

    Example::

        args = launch_command_parser().parse_args(["--cpu", "-n", "2", "train.py", "--epochs", "1"])
        launch_command(args)
    """
    code = _run(args, load_extensions())
    if code != 0:
        raise subprocess.CalledProcessError(code, [args.script, *args.script_args])


def main(argv: list[str]) -> int:
    extensions = load_extensions()
    parser = build_parser(extensions)
    namespace = parser.parse_args(argv)
    try:
        return _run(namespace, extensions)
    except LaunchUsageError as error:
        parser.error(str(error))


def _run(namespace: argparse.Namespace, extensions: list[LaunchExtension]) -> int:
    if namespace.script is None:
        raise LaunchUsageError(
            "the script to run is missing: accel launch [options] train.py [args], or -m package.module"
        )
    try:
        accelerate_variables, notes = accelerate_flags_env(namespace)
        torchrun = apply_torchrun_flags(namespace)
    except (RefusedFlagError, TorchrunFlagError) as refused:
        raise LaunchUsageError(str(refused)) from None
    plan = plan_from_namespace(namespace, extensions, flag_variables=accelerate_variables, torchrun=torchrun)
    if plan.torchrun_options and not plan.uses_torchrun:
        notes.append(
            f"{' '.join(plan.torchrun_options)}: torchrun's agent is not used for one process (it runs directly), so "
            "this does nothing here."
        )
    for note in [*notes, *torchrun.notes]:
        print(f"accel launch: {note}", file=sys.stderr)
    target = LaunchTarget(namespace.script, tuple(namespace.script_args), namespace.module)
    if namespace.dry_run:
        print(f"config file: {plan.config_file or '(none)'}\nsettings:\n{format_settings(plan)}")
        print(f"added to the environment:\n{format_env(plan.env)}\ncommand:\n  {format_command(plan, target)}")
        return 0
    try:
        return launch(plan, target)
    except (JobFailedError, RendezvousLostError) as failure:
        print(f"accel launch: {failure}", file=sys.stderr)
        return failure.exit_code
