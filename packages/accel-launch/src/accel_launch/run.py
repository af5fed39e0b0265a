"""Runs a ``LaunchPlan``: one process directly, anything more through torchrun's elastic agent.

The agent runs in this process (``torch.distributed.run``'s own ``parse_args`` + ``run``), so
``accel launch`` costs torchrun's start-up plus this package's argument handling, and a
failure arrives as torch's ``ChildFailedError``, which ``failures`` turns into a short message.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping

from accel_core.stall_probe import read_unreachable

from . import rendezvous
from .exit_watch import ChildExitWatch
from .failures import JobFailedError, RendezvousLostError
from .finish_records import FINISH_RECORDS, read_finishes, records_folder
from .lifeline import LAUNCHER_PID, preexec_die_with_parent
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
    runnable = os.path.isfile(target.script) or os.path.isfile(os.path.join(target.script, "__main__.py"))
    if not target.module and not runnable:
        raise ValueError(
            f"No such script: {target.script!r}. Pass a path to a Python file (or a folder holding __main__.py), or "
            "`-m package.module` for a module."
        )
    if target.module and ("/" in target.script or os.sep in target.script or os.path.isfile(target.script)):
        # `python -m` would answer "No module named examples/train.py" from every worker.
        dotted = target.script.removesuffix(".py").replace(os.sep, ".").replace("/", ".").strip(".")
        raise ValueError(
            f"-m {target.script}: -m takes a module's dotted name, not a file path: `-m {dotted}` (from the folder "
            f"above its package), or drop -m to run the file: `accel launch [options] {target.script}`."
        )


def direct_command(target: LaunchTarget) -> list[str]:
    """``python -u <script> args`` or ``python -u -m <module> args`` with this interpreter.

    ``-u`` as torchrun gives its workers: output sent to a pipe or a file (``| tee``, ``> log``) appears as it is
    written, and what was printed before the process is killed (the out-of-memory killer) is not lost with it.
    """
    head = [sys.executable, "-u", "-m", target.script] if target.module else [sys.executable, "-u", target.script]
    return head + list(target.args)


# Signals a launcher passes on to its one child; SIGKILL cannot be caught (the child's parent-death signal covers it).
_FORWARDED = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


def run_direct(plan: LaunchPlan, target: LaunchTarget) -> int:
    """Runs a one-process job as a plain child process; returns its exit code (128 + signal if killed).

    A signal sent to the launcher (SIGINT, SIGTERM, SIGHUP, SIGQUIT) reaches the child once, and the
    launcher waits for it to end. Run from a terminal (stdin is one), the child stays in the launcher's
    process group, so the terminal's Ctrl-C reaches it as it reaches ``python script.py`` and ``pdb`` or
    ``input()`` read the terminal; a signal the terminal sent to the group is not passed on again.
    Otherwise (a batch job, ``timeout``, CI, ``nohup``) the child has a process group of its own:
    a signal sent to the launcher's whole group (``timeout``'s, ``kill -- -PGID``) would otherwise
    reach the script twice, directly and passed on, and a script that saves on the first SIGTERM or
    Ctrl-C was interrupted by the second. The child dies with the launcher if the launcher is killed
    with SIGKILL (Linux).
    """
    _check_target(target)
    env = {**os.environ, **plan.env}
    if not hasattr(signal, "sigtimedwait"):  # not Linux (macOS, Windows): wait, the terminal stops both
        child = subprocess.Popen(direct_command(target), env=env)
        return _exit_status(_wait_through_interrupts(child))
    waited = {*_FORWARDED, signal.SIGCHLD}
    # Blocked, then read one by one with their sender's details; the child gets the mask it would have had.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    arm_death_signal = preexec_die_with_parent()
    own_group = not _reads_a_terminal()

    def child_setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if own_group:
            os.setpgid(0, 0)
        if callable(arm_death_signal):
            arm_death_signal()

    try:
        child = subprocess.Popen(direct_command(target), env=env, preexec_fn=child_setup)
        while child.poll() is None:
            info = signal.sigtimedwait(list(waited), 1.0)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            # A terminal sends SIGINT/SIGQUIT/SIGHUP to the whole foreground group (si_code SI_KERNEL): a
            # child in that group has it already. kill(2) sent it to the launcher, or to a group without the child.
            if own_group or info.si_code != _SI_KERNEL:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(info.si_signo)
        return _exit_status(child.returncode)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _reads_a_terminal() -> bool:
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, ValueError, OSError):  # no stdin, or a replaced one
        return False


_SI_KERNEL = 0x80  # Linux's si_code of a signal the kernel sent (the terminal driver's included)


def _wait_through_interrupts(child: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return child.wait()
        except KeyboardInterrupt:
            continue  # Ctrl-C reached the child too (same process group): let it finish its own way


def _exit_status(code: int) -> int:
    if code < 0 and -code not in {*_FORWARDED, signal.SIGPIPE}:  # not a stop asked for: say what a shell would
        try:
            name = signal.Signals(-code).name
        except ValueError:  # a real-time signal
            name = f"signal {-code}"
        print(
            f"accel launch: the script was killed by {name} (exit code {128 - code}). No Python traceback (out of "
            "memory, a crash in native code, ...); see its output above.",
            file=sys.stderr,
        )
    return 128 - code if code < 0 else code


def check_port_free(plan: LaunchPlan) -> None:
    """Raises ``ValueError`` naming the fix when ``--main-process-port`` is taken on the machine that must listen on it.

    Machine 0 hosts the rendezvous store on that port; a port another job holds would otherwise end
    in a long traceback from inside torch (EADDRINUSE).
    """
    port = plan.main_process_port
    if not port or plan.machine_rank != 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the store binds: on every interface, reusing a port that only lingers in TIME_WAIT.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            raise port_in_use(plan) from None


def port_in_use(plan: LaunchPlan) -> ValueError:
    """The error of a ``--main-process-port`` another process listens on, naming the fix."""
    free = (
        " or leave --main-process-port out (or pass 0) to get a free one"
        if plan.num_machines == 1
        else " (the same on every machine)"
    )
    return ValueError(
        f"--main-process-port {plan.main_process_port} is already in use on this machine (another job, or one still "
        f"ending). Pass another port{free}."
    )


def _is_rendezvous_error(error: BaseException) -> bool:
    """Whether ``error`` is torch's ``RendezvousError`` (closed, lost connection, timeout): imported by name only
    once the agent ran (torch is loaded by then)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    return isinstance(error, RendezvousError)


def _says_address_in_use(error: BaseException) -> bool:
    """Whether torch's store failed to listen because the address is taken (in ``error`` or what caused it)."""
    seen: BaseException | None = error
    while seen is not None:
        if "EADDRINUSE" in str(seen) or getattr(seen, "errno", None) == errno.EADDRINUSE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def run_torchrun(plan: LaunchPlan, target: LaunchTarget) -> int:
    """Runs the job under torchrun's agent in this process; raises ``JobFailedError`` when a rank fails."""
    _check_target(target)
    check_port_free(plan)
    finishes = records_folder()
    argv = torchrun_argv(plan, target, scratch=finishes.name)
    # Each worker's runner arms its parent-death signal when this process is its parent.
    launch_env = {**plan.env, LAUNCHER_PID: str(os.getpid()), FINISH_RECORDS: finishes.name}
    with finishes, patched_environ(launch_env), preserved_signal_handlers():
        # Heavy: torch. Imported only once a job is really about to start.
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

        watch = ChildExitWatch(fifo_folder=finishes.name)  # the runners announce failures through it
        try:
            with watch:
                run(parse_args(argv))
        except ChildFailedError as error:
            raise JobFailedError.from_child_failed(
                error,
                world_size=plan.num_processes,
                restarts=plan.max_restarts,
                monitor_interval=plan.monitor_interval,
                tracebacks_printed=True,
                alive_at=watch.alive_at,
                finished=read_finishes(finishes.name, attempt=plan.max_restarts),
                unreachable=read_unreachable(finishes.name),
            ) from None
        except SignalException as error:
            # Ctrl-C or a scheduler's SIGTERM: the agent stopped the workers; report like a shell.
            print(f"accel launch: stopped by {signal.Signals(error.sigval).name}.", file=sys.stderr)
            return 128 + int(error.sigval)
        except Exception as error:
            # The port was free when check_port_free looked and taken when the agent listened (two jobs started
            # together): the same message instead of torch's 80-line traceback.
            if plan.main_process_port and plan.machine_rank == 0 and _says_address_in_use(error):
                raise port_in_use(plan) from None
            if plan.num_machines > 1 and _is_rendezvous_error(error):  # not torch's 40-line C++ traceback
                endpoint = f"{plan.main_process_ip}:{plan.main_process_port}"
                raise RendezvousLostError.from_error(error, endpoint, plan.machine_rank) from None
            raise
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
        warning = rendezvous.warning(plan)
        if warning is not None:
            print(f"accel launch: warning: {warning}", file=sys.stderr)
        return run_torchrun(plan, target)
    return run_direct(plan, target)
