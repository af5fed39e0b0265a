"""accel-data installed alone: a fresh virtual environment holding only accel-core, accel-data (with
its ``stateful`` extra, i.e. torchdata) and the workspace's own torch version, running 2 processes
under torchrun (tests/data/isolated_checks.py).

uv installs torch from its wheel cache, so this costs seconds once the workspace is synced. It
needs ``uv`` and fails (never skips) without it: CI installs uv before anything else. Installing
torchdata next to a pinned torch also shows that the extra does not move torch to another version.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from checklist import RESULTS_ENV
from checkrun import HARNESS, CheckRun, checks_in, launch, torchrun_command

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "isolated_checks.py"


@pytest.fixture(scope="module")
def isolated_run(tmp_path_factory: pytest.TempPathFactory) -> CheckRun:
    """Builds the environment and launches isolated_checks.py in it, 2 processes; the run's per-check records."""
    tmp_path = tmp_path_factory.mktemp("isolated")
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build the isolated environment (pip install uv)"
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    # Bytecode is written (PYTHONDONTWRITEBYTECODE left out): the torchrun agent's torch import compiles it once and
    # the workers read it, instead of every process compiling torch again.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    subprocess.run([uv, "venv", "-q", str(venv), "--python", sys.executable], check=True, env=env)
    torch_version = importlib.metadata.version("torch")
    install = subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "--python",
            str(python),
            # Built from the working tree every time, never an older build from uv's cache.
            "--reinstall-package",
            "accel-core",
            "--reinstall-package",
            "accel-data",
            str(REPO / "packages" / "accel-core"),
            f"{REPO / 'packages' / 'accel-data'}[stateful]",
            f"torch=={torch_version}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert install.returncode == 0, (
        f"installing accel-data[stateful] with torch=={torch_version} failed:\n{install.stderr}"
    )
    installed = subprocess.run(
        [uv, "pip", "list", "--python", str(python)], capture_output=True, text=True, env=env, check=True
    )
    names = {line.split()[0].lower() for line in installed.stdout.splitlines()[2:] if line.strip()}
    assert {"accel-core", "accel-data", "torch", "torchdata"} <= names
    assert not names & {"accel", "accel-checkpoint", "accel-tracking"}, names
    # Only the harness (standard library alone) on the path besides the environment's own packages.
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HARNESS), RESULTS_ENV: str(tmp_path / "results")})
    command = torchrun_command(SCRIPT, python=str(python))
    # From the temporary folder: nothing of the workspace is importable from the working directory.
    return CheckRun.read(SCRIPT, 2, launch(command, env, timeout=300, cwd=tmp_path), tmp_path / "results")


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_accel_data_alone_in_a_fresh_environment(isolated_run: CheckRun, name: str) -> None:
    isolated_run.assert_passed(name)
