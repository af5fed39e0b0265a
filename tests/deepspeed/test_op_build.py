"""DeepSpeed's first CPU run compiles its shared-memory op: accel announces the build, recovers one that was killed
midway, loads a warm cache without a word, and never waits on a lock whose owner is gone.

The slow tests start real builds in a fresh TORCH_EXTENSIONS_DIR and stop them (a finished build is minutes of CPU),
and load the ops the session fixture built; the fast ones check the lock rules on real lock files: torch's FileBaton
left by a killed process, an OS lock held by a live one, accel's own build lock held by another process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from checkrun import worker_env
from torch.utils.file_baton import FileBaton

from accel_deepspeed.ops import ACCEL_LOCK, TORCH_LOCK, accel_build_lock, clear_stale_torch_lock

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILD_TIMEOUT = 1500  # seconds: a build is 1-2 min on 2 idle cores, many more on busy ones

_RUN = """
from accel import Accelerator
from accel_deepspeed import DeepSpeedPlugin

Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))
print("READY", flush=True)
"""
ANNOUNCED = "DeepSpeed compiles its C++ op deepspeed_shm_comm"


def _env(extensions: Path | None) -> dict[str, str]:
    """The run's environment; `extensions` None keeps this session's TORCH_EXTENSIONS_DIR (or torch's default)."""
    return worker_env(
        {"DS_ACCELERATOR": "cpu", **({} if extensions is None else {"TORCH_EXTENSIONS_DIR": str(extensions)})}
    )


def _stop_mid_build(extensions: Path, build_dir: Path, wait_for: tuple[str, ...], compiling: float = 3) -> str:
    """Starts a run, waits for each of `wait_for` in what it prints and for its compilers to be at work (`compiling`
    seconds after torch wrote build.ninja), then kills it and its compilers (SIGKILL, as a crash would); returns
    what it printed. Neither run finishes a build: a build is minutes of CPU here, and what is tested is what happens
    around one."""
    process = subprocess.Popen(
        [sys.executable, "-c", _RUN],
        env=_env(extensions),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    printed = ""
    deadline = time.monotonic() + BUILD_TIMEOUT
    try:
        while not all(text in printed for text in wait_for):
            line = process.stderr.readline()
            assert line, f"the run ended before printing {wait_for}:\n{printed}"
            printed += line
        while not (build_dir / "build.ninja").exists():  # written by torch right before it runs ninja
            assert time.monotonic() < deadline and process.poll() is None, printed
            time.sleep(0.2)
        time.sleep(compiling)  # the compiler is at work: one source file takes tens of seconds
    finally:
        # ninja starts each compiler in a process group of its own: kill them by parentage, as a crash would.
        for child in psutil.Process(process.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):  # a short-lived step (a compiler's helper) already ended
                child.kill()
        process.kill()
        process.wait()
    return printed


@pytest.mark.slow
def test_an_interrupted_build_is_found_and_built_again_without_waiting(tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"
    build_dir = extensions / "deepspeed_shm_comm"
    printed = _stop_mid_build(extensions, build_dir, (ANNOUNCED,))
    assert f"It is cached in {build_dir} (TORCH_EXTENSIONS_DIR sets the folder)" in printed, printed
    assert not (build_dir / "deepspeed_shm_comm.so").exists(), "the build finished before it was killed"

    # The next run names what it found and starts the build again at once (it never waits on the dead one's lock).
    found = f"found an unfinished build of DeepSpeed's deepspeed_shm_comm op in {build_dir}"
    # Its announcement comes after it took accel's lock and cleared torch's: what is checked has happened by then, and
    # its build.ninja is the first run's (no wait for a compiler that shows nothing more).
    again = _stop_mid_build(extensions, build_dir, (found, ANNOUNCED), compiling=0)
    print("\n".join(line for line in again.splitlines() if line.startswith("accel:")))


@pytest.mark.slow
def test_a_warm_cache_loads_quietly(deepspeed_ops: None) -> None:
    """With the ops built (the session fixture, in the suite's TORCH_EXTENSIONS_DIR), a start loads them without a
    word of building: no announcement, and DeepSpeed's own "built successfully" line dropped."""
    result = subprocess.run(
        [sys.executable, "-c", _RUN],
        env=_env(None),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )
    assert result.returncode == 0 and "READY" in result.stdout, result.stderr[-4000:]
    assert "built successfully" not in result.stdout + result.stderr, "DeepSpeed's line on a warm load was not dropped"
    assert ANNOUNCED not in result.stderr and "built DeepSpeed's" not in result.stderr, result.stderr


def test_torch_file_baton_left_by_a_killed_build_is_removed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lock = tmp_path / TORCH_LOCK
    baton = FileBaton(str(lock))
    assert baton.try_acquire()
    os.close(baton.fd)  # its owner is gone without releasing it, as a killed build
    assert not FileBaton(str(lock)).try_acquire(), "torch's FileBaton would wait on it"
    # With a torch whose lock is an OS lock, the file left behind blocks nobody: left alone, nothing said.
    clear_stale_torch_lock(tmp_path, "deepspeed_shm_comm", file_blocks=False)
    assert lock.exists() and capsys.readouterr().err == ""
    with accel_build_lock(tmp_path, "deepspeed_shm_comm"):
        clear_stale_torch_lock(tmp_path, "deepspeed_shm_comm", file_blocks=True)
    assert not lock.exists()
    assert (
        f"accel: removed {lock}, left by a build of DeepSpeed's deepspeed_shm_comm op that was stopped"
        in capsys.readouterr().err
    )


def test_a_lock_held_by_a_live_process_is_kept(tmp_path: Path) -> None:
    lock = tmp_path / TORCH_LOCK
    lock.touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl, os, time\nfd = os.open({str(lock)!r}, os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        clear_stale_torch_lock(tmp_path, "deepspeed_shm_comm", file_blocks=True)
        assert lock.exists(), "removed the lock of a live build"
    finally:
        holder.kill()
        holder.wait()


def test_waiting_for_another_builder_is_said(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from filelock import FileLock\nimport time\nlock = FileLock({str(tmp_path / ACCEL_LOCK)!r})\n"
            "lock.acquire()\nprint('held', flush=True)\ntime.sleep(1)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with accel_build_lock(tmp_path, "deepspeed_shm_comm", quiet_wait=0):
        waited = time.monotonic() - started
    holder.wait()
    assert waited > 0.3, "acquired accel's build lock while another process held it"
    message = f"waiting for another process that is building or loading DeepSpeed's deepspeed_shm_comm op in {tmp_path}"
    assert message in capsys.readouterr().err
