"""Worker-side entry of ``accel launch``: ``python -m accel_launch.runner path|module <target> [args]``.

Runs the target exactly as ``python <script>`` / ``python -m <module>`` would (``sys.argv``,
``sys.path[0]``, ``__main__``), and when it raises, writes the traceback to the file torchrun's
agent reads (``TORCHELASTIC_ERROR_FILE``), so the launcher can name the failing rank and show its
traceback without the user decorating anything with ``@record``.

Its first step arms the parent-death signal (``lifeline``): a worker dies with its launcher, even
one killed with SIGKILL. It records the exact time of a failure (``extraInfo.failed_at``), an
exception or a ``sys.exit`` with a non-zero code, so that the launcher can tell which rank failed
first.

Imports neither torch nor anything heavy: a script that does not need torch starts in milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import io
import json
import os
import runpy
import sys
import tempfile
import threading
import time
import traceback
import types
import zipfile
from types import TracebackType
from typing import NoReturn

from .exit_watch import announce_failure
from .finish_records import record_finish
from .lifeline import die_with_launcher

# Frames of this wrapper and of runpy are noise in the user's traceback.
_OWN_FILES = {__file__, getattr(runpy, "__file__", ""), "<frozen runpy>"}


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return tb


def record_error(error: BaseException, tb: TracebackType | None) -> None:
    """Writes ``error`` in the JSON layout of torch's ``ErrorHandler``, which the agent's ``ProcessFailure`` reads.

    ``extraInfo.failed_at`` (accel's addition) is the time to the microsecond; torch's ``timestamp``
    is whole seconds, too coarse to order two ranks that failed within a second.
    """
    now = time.time()
    announce_failure()  # the launcher's exit watch now sees the other ranks running after `now`
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {
        "message": {
            "message": f"{type(error).__name__}: {error}",
            "extraInfo": {
                "py_callstack": "".join(traceback.format_exception(type(error), error, tb)),
                "timestamp": str(int(now)),
                "failed_at": repr(now),
            },
        }
    }
    # Written whole or not at all (a temporary file renamed over it): the agent sends SIGTERM, then SIGKILL, to the
    # other ranks when one fails, and a rank killed halfway through an `open(path, "w")` left an empty file that made
    # torch's agent raise JSONDecodeError in the launcher, which then ended the job instead of restarting it.
    temporary = None
    try:
        descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".error-", suffix=".json")
        with os.fdopen(descriptor, "w") as handle:
            json.dump(data, handle)
        os.replace(temporary, path)
        temporary = None
    except OSError as write_error:  # the traceback still reaches stderr
        print(f"accel: could not write the error file {path}: {write_error}", file=sys.stderr)
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def run(kind: str, target: str, args: list[str]) -> None:
    """Runs ``target`` (a script path when ``kind == "path"``, else a module name) as ``__main__``."""
    sys.argv = [target, *args]
    if kind == "path":
        # `python script.py` puts the script's folder first on sys.path, not the working directory.
        path = os.path.abspath(target)
        sys.path[0] = os.path.dirname(path)
        if os.path.isdir(path) or zipfile.is_zipfile(path):  # a folder or zip with __main__.py: runpy's layout
            runpy.run_path(path, run_name="__main__")  # absolute: it becomes sys.path[0], as python puts it
        else:
            run_source_file(path)
    elif kind == "module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        raise SystemExit(f"accel runner: unknown kind {kind!r} (expected 'path' or 'module').")


def run_source_file(path: str) -> None:
    """Runs the Python file at ``path`` (absolute) as ``__main__``, as ``python script.py`` does.

    Not ``runpy.run_path``: it sets ``sys.argv[0]`` to the path it is given, and Python 3.9+ gives a script an
    absolute ``__file__`` (``Path(__file__).parents[1]`` of a script started as ``train.py`` must work) while
    ``sys.argv[0]`` stays as typed. Classes the script defines pickle by ``__main__``, as there.
    """
    with io.open_code(path) as file:
        code = compile(file.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__=None, __spec__=None)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def exit_without_finalization(code: int = 0) -> NoReturn:
    """Ends a worker whose script finished, as the interpreter would, minus its final teardown.

    Why: 2-process CPU runs in CI (2 of 7 fresh-clone runs, never in 55 local runs) aborted after
    the script had finished, with "terminate called without an active exception" and no Python
    frame: a native thread object destroyed while the interpreter tore down modules and C++
    statics. Everything a script can observe still happens here: non-daemon threads are joined (an
    async checkpoint completes), atexit handlers run (trackers, logging, process-group teardown),
    files the script left open are flushed, garbage is collected, stdio is flushed; then the
    process leaves with ``os._exit``, skipping only that teardown.
    """
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    # Files still open are flushed as teardown would, before any collection: io objects freed
    # together in a reference cycle can lose their text buffer (CPython bpo-17852).
    # `type(obj)`, not `isinstance(obj, ...)`: isinstance reads `obj.__class__`, an attribute access
    # that runs code of any object defining __getattribute__ (torch.distributed.reduce_op warns).
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase) and obj is not sys.stdin:
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass
    gc.collect()  # finalizers of what the script left in cycles
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def whole_lines() -> None:
    """Makes stdout and stderr write whole lines at once, still as soon as each line ends.

    torchrun starts workers with ``python -u``: every write reaches the shared terminal or pipe at once, and
    ``print`` writes its text and its newline separately, so two ranks printing together glued lines together
    mid-line (in a 2-process run printing 3000 lines each, about 6% arrived intact). Line buffering keeps each
    line in one write (a pipe takes up to 4096 bytes in one piece) and shows it when it ends, as a terminal does
    for ``python script.py``; output without a newline appears on ``flush()`` (tqdm flushes).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(line_buffering=True, write_through=False)  # pyright: ignore[reportAttributeAccessIssue]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        raise SystemExit("usage: python -m accel_launch.runner path|module <target> [args...]")
    die_with_launcher()
    faulthandler.enable(all_threads=True)  # a crash in native code still shows where
    whole_lines()
    try:
        run(argv[0], argv[1], argv[2:])
    except SystemExit as exit:
        if exit.code in (None, 0):
            record_finish()
            note_returned_to_peers()
            exit_without_finalization(0)
        record_error(exit, _user_frames(exit.__traceback__))  # when it failed, and where it called sys.exit
        raise
    except Exception as error:  # noqa: BLE001 - recorded for `accel launch`, then exit status 1
        tb = _user_frames(error.__traceback__)
        record_error(error, tb)
        sys.excepthook(type(error), error.with_traceback(tb), tb)
        raise SystemExit(1) from None
    except BaseException as error:  # KeyboardInterrupt and kin keep their own exit status
        record_error(error, _user_frames(error.__traceback__))
        raise
    record_finish()
    note_returned_to_peers()
    exit_without_finalization(0)


def note_returned_to_peers() -> None:
    """Tells peers still waiting to set up the process group that this rank's script ended (they stop with an
    error naming it, not after the group timeout: ``accel_core.attempt_store``). Only when the script imported
    torch.distributed: one that did not costs no torch import here."""
    if "torch.distributed" not in sys.modules:
        return
    from accel_core.attempt_store import note_returned

    note_returned(int(os.environ.get("RANK", "0")))


if __name__ == "__main__":
    main()
