"""What the packaging tests share: one build of the accel wheels and sdists, and uv.lock's versions as constraints.

test_wheels.py (the README's install lines) and test_shim.py (the `accelerate` shim beside the accel wheels) both
install from the same build of this checkout; built once per session (`uv build --all-packages`: about 8 s on the
quiet 2-core machine, 37 s at load 9), not once per module.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The repository README's build command; its install lines read the wheels from `dist`.
BUILD = ["uv", "build", "--all-packages", "-o", "dist"]


@pytest.fixture(scope="session")
def accel_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`dist/`, built by the README's command from this checkout: every workspace distribution's wheel and sdist (the
    shim, no workspace member, is not among them). Read only: a test that adds files copies it first."""
    folder = tmp_path_factory.mktemp("clone") / "dist"
    subprocess.run([*BUILD[:-1], str(folder), "-q"], cwd=REPO, check=True, timeout=600)
    return folder


@pytest.fixture(scope="session")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """uv.lock's versions of the third-party packages (UV_CONSTRAINT), so installs link them from uv's cache instead
    of downloading newer ones."""
    path = tmp_path_factory.mktemp("constraints") / "uv-lock.txt"
    export = ["uv", "export", "--frozen", "--all-packages", "--no-hashes", "--no-emit-workspace", "--no-header"]
    subprocess.run([*export, "--no-annotate", "-q", "-o", str(path)], cwd=REPO, check=True)
    return path
