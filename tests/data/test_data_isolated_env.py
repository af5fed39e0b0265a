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
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "isolated_checks.py"


# As tests/conftest.py's rendezvous_args: torchrun binds a free port itself and keeps it (no
# bind-then-release race with other jobs); conftest helpers cannot be imported under importlib mode.
RENDEZVOUS = ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accel_data_alone_in_a_fresh_environment(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to build the isolated environment (pip install uv)"
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
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
    env.update(OMP_NUM_THREADS="1")
    command = [
        str(python),
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        *RENDEZVOUS,
        f"--rdzv-id={uuid.uuid4()}",
        str(SCRIPT),
    ]
    try:
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False
        )
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"isolated run did not finish (a hang?)\nstdout:\n{error.stdout}\nstderr:\n{error.stderr}")
    output = result.stdout + result.stderr[-6000:]
    assert result.returncode == 0, output
    assert "ISOLATED CHECKS PASSED 0" in result.stdout and "ISOLATED CHECKS PASSED 1" in result.stdout, output
