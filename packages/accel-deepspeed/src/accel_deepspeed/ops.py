"""DeepSpeed's C++ ops, compiled on first use: accel says what is built, waits visibly, and recovers an interrupted
build instead of waiting on its lock forever.

On the CPU DeepSpeed compiles (JIT, through ``torch.utils.cpp_extension``) two ops the first time they are used:
``deepspeed_shm_comm`` (its shared-memory collectives, when ``deepspeed.init_distributed`` starts) and ``cpu_adam``
(``DeepSpeedCPUAdam``, for optimizer offload). The build takes minutes, once; the library is cached in
``$TORCH_EXTENSIONS_DIR/<op>`` (else torch's default, ``~/.cache/torch_extensions/py<XY>_<cpu|cuXYZ>/<op>``) and
later runs load it in a second. accel loads the op itself first (``load_op``), so that

- a build is announced before it starts (what, that it happens once, where it is cached) and timed when done;
  a warm cache loads silently (DeepSpeed's "built successfully" line, printed on every start, is dropped);
- processes building the same op take turns on accel's own lock, ``<build dir>/accel-build.lock`` (an OS lock,
  which the kernel releases when its holder dies), and a waiting process says whom it waits for;
- a build left unfinished by a killed run is named, and torch's lock file from it is cleared when it would block.

How a lock whose owner is gone is recognised: torch 2.9 (and older) locks a build with ``FileBaton``, a file
(``<build dir>/lock``) whose mere existence blocks, with no owner recorded; a killed build leaves it and every
later build waits on it forever. torch 2.15 holds an OS lock on that file instead (``filelock``), which dies with
its process (the file stays, blocking nobody). accel builds only while it holds ``accel-build.lock``, so when
accel holds it no accel process is building; if torch's ``lock`` file is there and no process holds an OS lock on
it either, its owner is gone: accel removes it and says so. (A process outside accel building the same op in the
same folder at that very moment, with a ``FileBaton`` torch, would look the same: give such runs their own
``TORCH_EXTENSIONS_DIR``.)

Example::

    from accel_deepspeed.ops import CPU_ADAM, load_op

    load_op(CPU_ADAM)  # before DeepSpeedCPUAdam(...): built once, announced; loaded quietly afterwards
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from filelock import FileLock, Timeout

from ._deepspeed import ds_accelerator

SHM_COMM = "ShareMemCommBuilder"
CPU_ADAM = "CPUAdamBuilder"
# What each op is for, in the message shown before it is built.
PURPOSES = {
    SHM_COMM: "shared-memory collectives between the processes of one machine, for deepspeed.init_distributed",
    CPU_ADAM: "DeepSpeedCPUAdam, the optimizer of optimizer offload",
}
ACCEL_LOCK = "accel-build.lock"
# Waiting this long for another process's build lock goes unsaid: the ranks of one machine take turns loading a
# cached op, each for about a second.
QUIET_WAIT_SECONDS = 10.0
TORCH_LOCK = "lock"  # torch.utils.cpp_extension's lock in the build folder
# DeepSpeed prints it after loading its shared-memory op, built or not (deepspeed/comm/torch.py: build_shm_op).
LOADED_LINE = re.compile(r"DeepSpeed \S+ built successfully")

_loaded: set[str] = set()


def say(text: str) -> None:
    """A line for the user on stderr (stdout is the training script's)."""
    print(f"accel: {text}", file=sys.stderr, flush=True)


def load_op(builder_name: str) -> None:
    """Builds (once, announced) or loads (quietly) DeepSpeed's op ``builder_name`` for the current accelerator.

    Nothing happens for an op the accelerator does not have or cannot build here (DeepSpeed then goes without it,
    or says why), nor for one installed prebuilt (``DS_BUILD_OPS=1``).
    """
    if builder_name in _loaded:
        return
    builder = ds_accelerator().create_op_builder(builder_name)
    if builder is None or not builder.is_compatible(False):
        return
    from deepspeed.git_version_info import installed_ops

    if installed_ops.get(builder.name, False):
        builder.load(verbose=False)  # compiled when DeepSpeed was installed: an import
        _loaded.add(builder_name)
        return
    build_dir = build_directory(builder.name)
    with accel_build_lock(build_dir, builder.name):
        clear_stale_torch_lock(build_dir, builder.name, torch_lock_outlives_its_owner())
        cached = (build_dir / f"{builder.name}{library_suffix()}").exists()
        if not cached:
            announce_build(build_dir, builder.name, PURPOSES.get(builder_name, ""))
        started = time.monotonic()
        builder.load(verbose=False)
        if not cached:
            say(f"built DeepSpeed's {builder.name} op in {time.monotonic() - started:.0f} s; later runs load it.")
    _loaded.add(builder_name)


def build_directory(name: str) -> Path:
    """Where torch builds and caches the JIT extension ``name`` (created if missing)."""
    from torch.utils import cpp_extension

    # torch's own rule (TORCH_EXTENSIONS_DIR, else its default root and a py<XY>_<cpu|cuXYZ> folder); private, and
    # stable since torch 1.x: writing the rule again here would drift from the torch installed.
    return Path(cpp_extension._get_build_directory(name, verbose=False))


def library_suffix() -> str:
    """The extension of the library torch builds (``.so``)."""
    from torch.utils import cpp_extension

    return cpp_extension.LIB_EXT


def announce_build(build_dir: Path, name: str, purpose: str) -> None:
    """The message shown before a build: what, that it happens once, where it is cached."""
    if (build_dir / "build.ninja").exists():
        say(f"found an unfinished build of DeepSpeed's {name} op in {build_dir} (a run stopped while compiling it).")
    from torch.utils import cpp_extension

    # Told from the folder torch chose (build_directory), not from the environment: torch's default root, else the
    # TORCH_EXTENSIONS_DIR torch read.
    default = Path(cpp_extension.get_default_build_root())
    root = "torch's default; TORCH_EXTENSIONS_DIR" if default in build_dir.parents else "TORCH_EXTENSIONS_DIR"
    what = f" ({purpose})" if purpose else ""
    say(
        f"DeepSpeed compiles its C++ op {name}{what} now: this takes a few minutes, once. It is cached in "
        f"{build_dir} ({root} sets the folder); later runs load it in a second."
    )


@contextlib.contextmanager
def accel_build_lock(build_dir: Path, name: str, quiet_wait: float = QUIET_WAIT_SECONDS) -> Iterator[None]:
    """Holds ``<build_dir>/accel-build.lock`` (an OS lock: released by the kernel if this process dies), saying so
    when another process holds it for more than ``quiet_wait`` seconds."""
    lock = FileLock(build_dir / ACCEL_LOCK)
    try:
        lock.acquire(timeout=quiet_wait)
    except Timeout:
        say(f"waiting for another process that is building or loading DeepSpeed's {name} op in {build_dir}.")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def clear_stale_torch_lock(build_dir: Path, name: str, file_blocks: bool) -> None:
    """Removes torch's ``lock`` file when it would block (``file_blocks``: this torch's lock is the file's
    existence) and its owner is gone. Call it with accel's lock held."""
    path = build_dir / TORCH_LOCK
    if not file_blocks or not path.exists() or held_by_a_process(path):
        return  # a lock file that blocks nobody (torch's filelock), no lock, or a live build holding an OS lock
    path.unlink(missing_ok=True)
    say(
        f"removed {path}, left by a build of DeepSpeed's {name} op that was stopped (no process is building it: "
        f"accel's {ACCEL_LOCK} there was free); torch would have waited on it forever."
    )


def held_by_a_process(path: Path) -> bool:
    """Whether some process holds an OS lock (``flock``) on the existing file ``path``."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return False
    finally:
        os.close(descriptor)


def torch_lock_outlives_its_owner() -> bool:
    """True when this torch locks JIT builds with ``FileBaton`` (the lock is a file's existence, left behind by a
    killed build), False when it holds an OS lock (``filelock``) that dies with its process."""
    from torch.utils import cpp_extension

    # A feature of the installed torch, read from its module: the release that switched is not documented.
    return "FileBaton" in vars(cpp_extension)


class _LineFilter(io.TextIOBase):
    """A text stream that forwards whole lines to ``target``, dropping those ``pattern`` matches."""

    def __init__(self, target: TextIO, pattern: re.Pattern[str]) -> None:
        self._target, self._pattern, self._pending = target, pattern, ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if not self._pattern.fullmatch(line):
                self._target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def close_pending(self) -> None:
        """Forwards a last line without its newline."""
        if self._pending and not self._pattern.fullmatch(self._pending):
            self._target.write(self._pending)
        self._pending = ""


@contextlib.contextmanager
def without_loaded_op_message() -> Iterator[None]:
    """Drops DeepSpeed's "DeepSpeed ... built successfully" line from stdout (``load_op`` said what happened)."""
    line_filter = _LineFilter(sys.stdout, LOADED_LINE)
    try:
        with contextlib.redirect_stdout(line_filter):
            yield
    finally:
        line_filter.close_pending()
