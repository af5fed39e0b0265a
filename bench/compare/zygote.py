"""A fork server for --quick: imports torch and one framework once, then forks worker.py's ranks on request.

    python zygote.py FRAMEWORK      # run.py starts one per framework, in that framework's environment

A --quick run launches worker.py about 13 times per framework; each fresh process would spend most of its few
seconds re-importing torch and the framework. This process imports them once, does no tensor work (so no thread
pool exists when it forks), and serves requests, one JSON line each on stdin:

    {"argv": [...], "envs": [{...}, ...], "cwd": "...", "logs": ["...", ...], "timeout": 900}

For each entry of "envs" (one per rank) it forks a child that takes that environment, argv and working folder,
writes its stderr to the matching log file and runs worker.main(). It waits as run.py's Popen path does (after
the first failure, 20 s of grace for the others, then they are killed; all of them at the timeout) and answers
one JSON line: {"codes": [exit code or -signal per rank], "cpu": this process's CPU seconds and its reaped
children's}. At the end of stdin, on SIGTERM or Ctrl-C it kills any child left and exits. The full run never
uses it: its figures come from fresh processes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# What make() and the scenarios import in each environment, so that a forked child finds it imported.
# torch._dynamo: torch imports it on the first optimizer step (5-10 s of CPU in each child otherwise). DeepSpeed is
# not preloaded: in the workspace environment its import pulls in mlflow and pyarrow, whose allocator starts a
# background thread (a fork would copy its locks in any state); only the ZeRO-3 launches need it.
COMMON = (
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
)
PRELOAD = {
    "accel": ("accel",),
    "raw": (),
    "accelerate": ("accelerate", "accelerate.data_loader"),
    "fabric": ("lightning_fabric", "lightning_fabric.strategies"),
}
GRACE_S = 20  # after a rank fails (wait_ranks)


def preload(framework: str) -> None:
    import pkgutil

    import scenarios

    ours = [f"scenarios.{m.name}" for m in pkgutil.iter_modules(scenarios.__path__)]
    for name in (*COMMON, *PRELOAD[framework], "frameworks", "worker", *ours):
        importlib.import_module(name)
    if framework == "accel":
        import accel

        accel.Accelerator  # noqa: B018 - the package resolves it lazily: the import happens here, once


def child(argv: list[str], env: dict[str, str], cwd: str, log: str, replies: int) -> None:
    """In the forked process: becomes `python worker.py argv...` and never returns."""
    code = 1
    try:
        os.close(replies)  # else run.py would not see the end of a zygote that died while this child lives
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = list(argv)
        import worker

        try:
            worker.main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever ends the child is its log's last word, and exit code 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # nothing left to report to
                stream.flush()
        os._exit(code)


def status_code(status: int) -> int:
    """waitpid's status as Popen.returncode reads it: the exit code, or minus the signal that ended the child."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(request: dict, children: dict[int, int | None], replies: int) -> list[int | None]:
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered here may be written a second time by a child
    pids = []
    for env, log in zip(request["envs"], request["logs"], strict=True):
        pid = os.fork()
        if pid == 0:
            child(request["argv"], env, request["cwd"], log, replies)
        pids.append(pid)
        children[pid] = None

    def poll() -> list[int | None]:
        for pid in pids:
            if children[pid] is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children[pid] = status_code(status)
        return [children[p] for p in pids]

    wait_ranks(poll, request["timeout"])
    kill(children)
    codes = [children.pop(p) for p in pids]
    return codes


def wait_ranks(poll: Callable[[], list[int | None]], timeout: float) -> None:
    """Waits until `poll()` (each rank's exit code, None while it runs) has every rank ended, at most `timeout`
    seconds, and GRACE_S after a rank fails: the others may be writing their results, then they are taken to hang
    on the failed one. The caller kills those left. run.py's Popen path waits the same way."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = poll()
        if None not in codes:
            return
        if any(c not in (None, 0) for c in codes):
            deadline = min(deadline, time.monotonic() + GRACE_S)
        time.sleep(0.05)


def kill(children: dict[int, int | None]) -> None:
    for pid, code in children.items():
        if code is None:
            try:
                os.kill(pid, signal.SIGKILL)
                children[pid] = status_code(os.waitpid(pid, 0)[1])
            except (ProcessLookupError, ChildProcessError):
                children[pid] = -signal.SIGKILL


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it reaped (run.py adds the zygotes' to its own)."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def main() -> None:
    framework = sys.argv[1]
    replies = os.fdopen(os.dup(1), "w")  # the protocol's channel; fd 1 itself goes to stderr, so that whatever an
    os.dup2(2, 1)  # import prints cannot garble a reply
    children: dict[int, int | None] = {}

    def stop(signum, frame):  # SIGTERM from run.py: the same exit as the end of stdin
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        preload(framework)
        replies.write(json.dumps({"ready": True, "cpu": cpu_seconds()}) + "\n")
        replies.flush()
        for line in sys.stdin:
            codes = serve(json.loads(line), children, replies.fileno())
            replies.write(json.dumps({"codes": codes, "cpu": cpu_seconds()}) + "\n")
            replies.flush()
    except KeyboardInterrupt:
        pass
    finally:
        kill(children)


class Zygote:
    """run.py's end of one zygote: starts it (in `python`, the framework's environment) and sends it requests, one
    at a time."""

    def __init__(self, framework: str, python: str, env: dict[str, str], cwd: str) -> None:
        import subprocess
        import tempfile
        import threading

        self.framework, self.lock, self.cpu = framework, threading.Lock(), 0.0
        start = time.perf_counter()
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by close(); its own stderr: import warnings, and why it died if it did
        self.process = subprocess.Popen(
            [python, os.path.abspath(__file__), framework],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd=cwd,
            text=True,
        )
        self._reply()
        self.start_s, self.start_cpu = time.perf_counter() - start, self.cpu  # its imports, once

    def _reply(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            raise RuntimeError(
                f"the {self.framework} zygote exited ({self.process.wait()}):\n{self.log.read()[-2500:]}"
            )
        reply = json.loads(line)
        self.cpu = reply["cpu"]
        return reply

    def run(
        self, argv: list[str], envs: list[dict[str, str]], cwd: str, logs: list[str], timeout: float
    ) -> tuple[list[int], float]:
        """Forks one rank per entry of `envs`; their exit codes (minus the signal for a killed one) and the CPU
        seconds they used (exact: a zygote serves one request at a time)."""
        request = {"argv": argv, "envs": envs, "cwd": cwd, "logs": logs, "timeout": timeout}
        with self.lock:
            assert self.process.stdin is not None
            before = self.cpu
            try:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):  # it has exited (stdin closed by close(): ValueError)
                return self._reply()["codes"], 0.0  # raises, with its exit code and stderr
            return self._reply()["codes"], self.cpu - before

    def close(self) -> None:
        """Ends it (it kills any child left) and reaps it: its CPU time then counts among run.py's children."""
        import subprocess

        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.cpu = 0.0
        self.log.close()


class Zygotes:
    """One zygote per framework, started on first use; `close` ends them all."""

    def __init__(self, python, env, cwd: str) -> None:
        import threading

        self.python, self.env, self.cwd = python, env, cwd
        self.started: dict[str, Zygote] = {}
        self.locks: dict[str, threading.Lock] = {}
        self.lock = threading.Lock()

    def get(self, framework: str) -> Zygote:
        import threading

        with self.lock:
            lock = self.locks.setdefault(framework, threading.Lock())
        with lock:  # two frameworks start theirs at once, a framework only one
            if framework not in self.started:
                self.started[framework] = Zygote(framework, self.python(framework), self.env(framework), self.cwd)
            return self.started[framework]

    def cpu(self) -> float:
        """CPU seconds of the live zygotes and the children they reaped (not yet among run.py's children)."""
        return sum(z.cpu for z in list(self.started.values()))

    def close(self) -> None:
        for zygote in list(self.started.values()):
            zygote.close()
        self.started.clear()


if __name__ == "__main__":
    main()
