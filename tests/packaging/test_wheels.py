"""Every distribution builds its own wheel, and `accel` installs from those wheels into a fresh
virtual environment and imports: a broken package boundary fails here before users see it."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.name for p in (REPO / "packages").iterdir() if (p / "pyproject.toml").exists())


def _version_of(package: str) -> str:
    text = (REPO / "packages" / package / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    for package in PACKAGES:
        subprocess.run(["uv", "build", "--package", package, "--wheel", "-o", str(out), "-q"], cwd=REPO, check=True)
    found = {}
    for wheel in out.glob("*.whl"):
        found[wheel.name.split("-")[0].replace("_", "-")] = wheel
    return found


def test_each_distribution_has_its_own_versioned_wheel(wheels):
    assert sorted(wheels) == PACKAGES
    for package, wheel in wheels.items():
        assert f"-{_version_of(package)}-" in wheel.name


def test_each_wheel_ships_py_typed(wheels):
    # PEP 561: without the marker, type checkers ignore the annotations of an installed package.
    for package, wheel in wheels.items():
        marker = f"{package.replace('-', '_')}/py.typed"
        with zipfile.ZipFile(wheel) as archive:
            assert marker in archive.namelist(), f"{wheel.name} lacks {marker}"


def test_meta_package_depends_on_compatible_ranges(wheels):
    with zipfile.ZipFile(wheels["accel"]) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith("METADATA"))
    requirements = re.findall(r"^Requires-Dist: (accel-[a-z]+)(.*)$", metadata, re.M)
    assert {name for name, _ in requirements} >= {"accel-core", "accel-data", "accel-checkpoint", "accel-tracking"}
    for name, spec in requirements:
        assert re.search(r">=\d", spec) and re.search(r"<\d", spec), f"{name}{spec} needs a compatible range"


def test_accel_installs_from_wheels_into_a_fresh_venv(wheels, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    base = [wheels[name] for name in ("accel", "accel-core", "accel-data", "accel-checkpoint", "accel-tracking")]
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(python), *map(str, base)], check=True, timeout=900)
    code = (
        "import accel, accel.utils\n"
        "from importlib.metadata import entry_points\n"
        "from accel import Accelerator\n"
        "assert {'dataloader'} <= {e.name for e in entry_points(group='accel.preparers')}\n"
        "assert {'state'} <= {e.name for e in entry_points(group='accel.checkpoint')}\n"
        "assert {'local'} <= {e.name for e in entry_points(group='accel.trackers')}\n"
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "acc = Accelerator(cpu=True)\n"
        "model, loader = acc.prepare(torch.nn.Linear(2, 1), DataLoader(list(range(6)), batch_size=2))\n"
        "assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]\n"
        "print('installed accel', accel.__version__)\n"
    )
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "installed accel 0.1.0" in result.stdout


def test_each_distribution_ships_the_repository_license():
    # license-files packs the package folder's copy; a copy that drifted from the repository's would ship stale text.
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    for package in PACKAGES:
        copy = REPO / "packages" / package / "LICENSE"
        assert copy.exists() and copy.read_text() == license_text, f"{copy} must be a copy of the repository's LICENSE"
