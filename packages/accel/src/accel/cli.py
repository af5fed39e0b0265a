"""The ``accel`` command: ``launch``, ``config``, ``env``, ``test``, ``estimate-memory``,
``merge-weights``, ``to-fsdp2``, ``plot``.

Each command lives in ``accel.commands.<name>`` (``-`` written ``_``) and is imported only when used,
so ``accel --help`` costs a Python start-up and nothing else (no torch, no YAML).
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

COMMANDS = {
    "launch": "run a training script on one or many processes / machines",
    "config": "write, show or import (from Accelerate) the launch config file",
    "env": "print versions, devices and the resolved config, for a bug report",
    "test": "launch a built-in check of the install with the current config (2 CPU processes by default)",
    "estimate-memory": "per-process bytes of a model's parameters, gradients and optimizer state, per strategy",
    "merge-weights": "merge a sharded (FSDP / DCP) checkpoint into one safetensors file",
    "to-fsdp2": "convert the fsdp section of a config file from FSDP1 to FSDP2 settings",
    "plot": "draw a run's metrics (the local tracker's metrics.jsonl) as a PNG: the loss curve",
}

# Accelerate's commands that accel does not provide, each with why and what to do instead: a habit typed out of
# Accelerate gets that answer, not a guess at a similar name.
NOT_PROVIDED = {
    "tpu-config": (
        "`accelerate tpu-config` runs a setup command on every host of a TPU pod through `gcloud`; accel does not "
        "provide it, because accel-xla runs on one host (multi-host XLA is not supported yet). Run the command on "
        "each host yourself: `gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker all --command '...'`."
    ),
}

USAGE = """usage: accel <command> [options]

Run one plain PyTorch training script on CPU, GPU, many GPUs or many machines.

commands:
{commands}

examples:
  accel launch --cpu -n 2 train.py --epochs 3
  accel launch -m mypackage.train
  accel config            (answer a few questions; `accel config default` asks none)
  accel test
  accel estimate-memory models.py:build_model -n 8
  accel merge-weights outputs/checkpoints/checkpoint_3 merged/
  accel plot runs/digits       (the loss curve of a run the local tracker wrote)

`accel <command> --help` describes a command's options."""


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = "\n".join(f"  {name.ljust(width)}  {text}" for name, text in COMMANDS.items())
    return USAGE.format(commands=lines)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("accel")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``accel`` console script; returns the exit code."""
    try:
        return _dispatch(sys.argv[1:] if argv is None else list(argv))
    except BrokenPipeError:
        # The reader of the output left early (`accel --help | head`): stop quietly, as other command-line tools do,
        # and keep Python from reporting the same error again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"accel {_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name in NOT_PROVIDED:
        print(f"accel: `accel {name}` is not provided: {NOT_PROVIDED[name]}", file=sys.stderr)
        return 2
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f" Did you mean `accel {close[0]}`?" if close else ""
        print(f"accel: unknown command {name!r}.{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    command = importlib.import_module(f"accel.commands.{name.replace('-', '_')}")
    try:
        return int(command.main(rest) or 0)
    except (ValueError, ImportError) as error:
        # A user error: say what to fix, without a traceback of our own code.
        print(f"accel {name}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """``sys.exit(main())`` for ``python -m accel.cli``."""
    sys.exit(main())


if __name__ == "__main__":
    run()
