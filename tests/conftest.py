"""Shared test fixtures: launching a script under torchrun with a timeout, so a hang fails the test, and launching a
check script whose checks pytest reports one by one (the harness in tests/harness/, on ``sys.path`` through the
``pythonpath`` setting of the root pyproject.toml).

Markers (registered in the root pyproject.toml): a test that uses the ``torchrun`` fixture is marked
``multiprocess`` and ``slow`` here (each launch imports torch in every process: seconds of CPU); ``slow`` for other
tests (another process that imports torch, or over ~3 s on the 2-core CI machine) and ``gpu`` are set by hand.
The fast lane, ``-m "not slow"``, stays under 5 minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from checkrun import CheckRun, declared_checks, launch, run_check_script, torchrun_command, worker_env

REPO = Path(__file__).resolve().parents[1]
# DeepSpeed's CPU ops and the DeepSpeed launch that tests/deepspeed and tests/bench share (session fixtures).
pytest_plugins = ("deepspeed_launch",)


def run_torchrun(
    script: str | Path,
    *args: str,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` on ``nproc`` CPU processes (gloo) with torch.distributed.run; fails on timeout."""
    launched = launch(torchrun_command(script, *args, nproc=nproc), worker_env(env), timeout)
    if launched.timed_out:
        pytest.fail(
            f"{script} did not finish within {timeout}s (a hang?)\nstdout:\n{launched.stdout}\n"
            f"stderr:\n{launched.stderr}"
        )
    if check and launched.returncode != 0:
        pytest.fail(
            f"{script} failed with exit code "
            f"{launched.returncode}\nstdout:\n{launched.stdout}\nstderr:\n{launched.stderr[-6000:]}"
        )
    return subprocess.CompletedProcess(launched.command, launched.returncode, launched.stdout, launched.stderr)


@pytest.fixture(scope="session")
def torchrun() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_torchrun``; session-scoped, so a module-scoped fixture can launch once for several tests."""
    return run_torchrun


@pytest.fixture(scope="session")
def torchrun_checks(torchrun, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., CheckRun]:
    """Launches a check script (tests/harness/checklist.py) under torchrun and returns its per-check records.

    ``torchrun_checks(script, *args, nproc=2, env=None, timeout=240, names=None)`` (``names``: see
    ``CheckRun.read``); a failed check or a non-zero exit does not fail here: each check's test reports its own
    outcome (tests/harness/checkrun.py)."""

    def run(
        script: str | Path,
        *args: str,
        nproc: int = 2,
        env: dict[str, str] | None = None,
        timeout: float = 240,
        names: list[str] | None = None,
    ) -> CheckRun:
        results = tmp_path_factory.mktemp(f"{Path(script).stem}-results")
        command = torchrun_command(script, *args, nproc=nproc)
        return run_check_script(command, script, nproc=nproc, env=env, timeout=timeout, results=results, names=names)

    return run


# tests/parallelism/mesh_checks.py's checks, then tests/pipeline/pipeline_checks.py's, in one 4-process launch.
LAYOUTS_DRIVER = REPO / "tests" / "multiprocess" / "four_process_layouts.py"
LAYOUT_SCRIPTS = (REPO / "tests" / "parallelism" / "mesh_checks.py", REPO / "tests" / "pipeline" / "pipeline_checks.py")


@pytest.fixture(scope="session")
def four_process_layouts(torchrun_checks, tmp_path_factory: pytest.TempPathFactory) -> tuple[CheckRun, Path]:
    """The launch of tests/multiprocess/four_process_layouts.py, shared by test_mesh_multiprocess.py and
    test_pipeline_multiprocess.py (whichever runs first starts it; each reports its own script's checks): the run and
    the folder both scripts write in."""
    folder = tmp_path_factory.mktemp(LAYOUTS_DRIVER.stem)
    names = [name for script in LAYOUT_SCRIPTS for name in declared_checks(script)]
    return torchrun_checks(LAYOUTS_DRIVER, str(folder), nproc=4, timeout=1200, names=names), folder


# tests/fsdp/train_checks.py's checks, then tests/bench/fsdp2_clip_checks.py's, in one 2-process launch.
FSDP_DRIVER = REPO / "tests" / "fsdp" / "two_process_checks.py"
FSDP_SCRIPTS = (REPO / "tests" / "fsdp" / "train_checks.py", REPO / "tests" / "bench" / "fsdp2_clip_checks.py")


@pytest.fixture(scope="session")
def fsdp_two_process_checks(torchrun_checks) -> CheckRun:
    """The launch of tests/fsdp/two_process_checks.py, shared by tests/fsdp/test_fsdp_multiprocess.py and
    tests/bench/test_fsdp2_clip.py (whichever runs first starts it; each reports its own script's checks)."""
    names = [name for script in FSDP_SCRIPTS for name in declared_checks(script)]
    return torchrun_checks(FSDP_DRIVER, timeout=360, names=names)


def _mirror_without(folder: Path, left_out: str) -> str:
    """A new folder holding a link to each entry of ``folder`` but ``left_out``."""
    mirror = Path(tempfile.mkdtemp(prefix=f"accel-tests-no-{left_out}-"))
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.name != left_out:
                (mirror / entry.name).symlink_to(entry)
    return str(mirror)


def pytest_configure(config: pytest.Config) -> None:
    # `accel launch` reads the contributor's own config files: accel's ($XDG_CONFIG_HOME/accel/default_config.yaml)
    # and, when there is none, Accelerate's ($HF_HOME/accelerate/default_config.yaml). With either, what the launch
    # tests see changes (8 of the fast lane failed with an `accelerate config` file). The session and every process
    # it starts see both folders without those entries; the rest (uv's and git's settings, the hub's cache) stays.
    # The folders come from the launcher's own lookup, so they follow it.
    from accel_launch.config import accelerate_default_config_path, default_config_path

    for variable, found in (("XDG_CONFIG_HOME", default_config_path()), ("HF_HOME", accelerate_default_config_path())):
        os.environ[variable] = mirror = _mirror_without(found.parent.parent, found.parent.name)
        config.add_cleanup(partial(shutil.rmtree, mirror, ignore_errors=True))  # the links, not what they lead to


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # fixturenames includes the fixtures a test uses through other fixtures.
        if "torchrun" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.multiprocess)
            item.add_marker(pytest.mark.slow)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_tests:
        import torch  # only when a gpu test was collected: collection stays free of torch otherwise

        if not torch.cuda.is_available():
            for item in gpu_tests:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
