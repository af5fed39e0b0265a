"""Runs a ``LaunchPlan``: one process directly, anything more through torchrun's elastic agent.

The agent runs in this process (``torch.distributed.run``'s own ``parse_args`` + ``run``), so
``accel launch`` costs torchrun's start-up plus this package's argument handling, and a
failure arrives as torch's ``ChildFailedError``, which ``failures`` turns into a short message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping

from .failures import JobFailedError
from .plan import LaunchPlan, LaunchTarget, torchrun_argv


@contextlib.contextmanager
def preserved_signal_handlers() -> Iterator[None]:
    """Restores the signal handlers torch's agent replaces (SIGTERM, SIGINT, ...) once it is done."""
    names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    saved = {}
    for name in names:
        if hasattr(signal, name):
            saved[getattr(signal, name)] = signal.getsignal(getattr(signal, name))
    try:
        yield
    finally:
        for signum, handler in saved.items():
            if handler is not None:
                with contextlib.suppress(ValueError):  # not the main thread: nothing was replaced
                    signal.signal(signum, handler)


@contextlib.contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Sets ``values`` in ``os.environ`` for the block (workers inherit it), then restores the old values."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def _check_target(target: LaunchTarget) -> None:
    if not target.module and not os.path.isfile(target.script):
        raise ValueError(
            f"No such script: {target.script!r}. Pass a path to a Python file, or `-m package.module` for a module."
        )


def direct_command(target: LaunchTarget) -> list[str]:
    """``python <script> args`` or ``python -m <module> args`` with this interpreter."""
    head = [sys.executable, "-m", target.script] if target.module else [sys.executable, target.script]
    return head + list(target.args)


def run_direct(plan: LaunchPlan, target: LaunchTarget) -> int:
    """Runs a one-process job as a plain child process; returns its exit code (128 + signal if killed)."""
    _check_target(target)
    child = subprocess.Popen(direct_command(target), env={**os.environ, **plan.env})
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:
            # Ctrl-C reached the child too (same process group): let it finish its own way.
            continue
    return 128 - code if code < 0 else code


def run_torchrun(plan: LaunchPlan, target: LaunchTarget) -> int:
    """Runs the job under torchrun's agent in this process; raises ``JobFailedError`` when a rank fails."""
    _check_target(target)
    argv = torchrun_argv(plan, target)
    with patched_environ(plan.env), preserved_signal_handlers():
        # Heavy: torch. Imported only once a job is really about to start.
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        try:
            run(parse_args(argv))
        except ChildFailedError as error:
            raise JobFailedError.from_child_failed(
                error, world_size=plan.num_processes, restarts=plan.max_restarts
            ) from None
        except SignalException as error:
            # Ctrl-C or a scheduler's SIGTERM: the agent stopped the workers; report like a shell.
            print(f"accel launch: stopped by {signal.Signals(error.sigval).name}.", file=sys.stderr)
            return 128 + int(error.sigval)
    return 0


def launch(plan: LaunchPlan, target: LaunchTarget) -> int:
    """Runs ``target`` as ``plan`` says and returns the job's exit code.

    One process on one machine without restarts runs directly; otherwise torchrun's agent starts
    ``plan.nproc_per_node`` workers here (and joins the other machines' agents). A failed rank
    raises ``JobFailedError`` (its ``exit_code`` is the rank's); the ``accel`` command prints it.

    Example::

        plan = resolve_plan({"num_processes": 2, "use_cpu": True}, os.environ, {})
        exit_code = launch(plan, LaunchTarget("train.py", ("--epochs", "3")))
    """
    if plan.uses_torchrun:
        return run_torchrun(plan, target)
    return run_direct(plan, target)
