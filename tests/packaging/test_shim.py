"""The opt-in `accelerate` shim (packages/accelerate, docs/frameworks.md): built with `uv build` beside the accel
wheels and installed into a fresh environment, `import accelerate` is accel (same module objects, Accelerate's API
level as `__version__`, no torch on import); and because the distribution's name is `accelerate`, installing Hugging
Face's Accelerate replaces it and installing it replaces that, with `uv pip` and with `pip`: one distribution of
the name, never both. (`accelerate==1.15.0` alone is satisfied by the shim, PEP 440's local-label rule: turning it
off asks for a reinstall, as the docs say.) Also that the workspace itself never holds an `accelerate` (installing
accel alone must not change what `import accelerate` means)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
SHIM_VERSION = "1.15.0+accel.0.1.0"
ACCELERATE = "1.15.0"  # the Accelerate release the shim answers for, and the one that replaces it here
# Each environment's bytecode, kept between runs (as test_wheels.py's Venv does): torch compiled once.
BYTECODE = Path.home() / ".cache" / "accel-ci" / "packaging-venvs" / "shim-bytecode"
IGNORED_ENVIRONMENT = {
    "UV_LOCKED",
    "UV_FROZEN",
    "UV_PROJECT_ENVIRONMENT",
    "UV_PYTHON",
    "UV_SYSTEM_PYTHON",
    "PYTHONPATH",
}

# What `import accelerate` is in the environment, as JSON. Torch is looked for right after `import accelerate`.
PROBE = r"""
import importlib.metadata as metadata, json, sys
import accelerate
light = "torch" not in sys.modules
import accelerate.utils.memory
from accelerate import Accelerator
print(json.dumps({
    "distributions": sorted(d.version for d in metadata.distributions() if d.metadata["Name"] == "accelerate"),
    "version": accelerate.__version__,
    "light": light,
    "memory_module": sys.modules["accelerate.utils.memory"].__name__,
    "same_object": sys.modules["accelerate.utils.memory"] is sys.modules.get("accel.utils.memory"),
    "accelerator_class": f"{Accelerator.__module__}.{Accelerator.__qualname__}",
    "accel_installed": any(d.metadata["Name"] == "accel" for d in metadata.distributions()),
}))
"""


def test_the_workspace_never_holds_accelerate():
    # The shim is no workspace member and nothing in the lock is named accelerate: the README's `uv sync` leaves
    # `import accelerate` failing here, as a user who installs accel alone sees it.
    root = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^exclude = \["packages/accelerate"\]', root, re.M), "the shim must stay out of the workspace"
    assert not re.search(r'^name = "accelerate"$', (REPO / "uv.lock").read_text(), re.M), "uv.lock holds accelerate"
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print(u.find_spec('accelerate'))"],
        capture_output=True,
        text=True,
        check=True,
        env=_without_pythonpath(),
    )
    assert found.stdout.strip() == "None", found.stdout


def _without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


class Environment:
    """A fresh virtual environment (with pip, for the pip half) that installs read the wheels of ``dist`` into."""

    def __init__(self, path: Path, dist: Path, constraints: Path) -> None:
        subprocess.run(["uv", "venv", "-q", "--seed", "--clear", "--python", sys.executable, str(path)], check=True)
        self.python = path / "bin" / "python"
        self.site_packages = path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        self.dist = dist
        env = {k: v for k, v in os.environ.items() if k not in IGNORED_ENVIRONMENT}
        self.env = {**env, "VIRTUAL_ENV": str(path), "UV_CONSTRAINT": str(constraints)}
        self.env["PYTHONPYCACHEPREFIX"] = str(BYTECODE)
        self.env["PATH"] = f"{path / 'bin'}{os.pathsep}{os.environ['PATH']}"

    def command(self, args: list[str]) -> str:
        result = subprocess.run(args, cwd=self.dist.parent, env=self.env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr[-6000:]}"
        return result.stdout + result.stderr

    def probe(self) -> dict:
        return json.loads(self.command([str(self.python), "-c", PROBE]).splitlines()[-1])

    def accelerate_records(self) -> list[str]:
        return sorted(p.name for p in self.site_packages.glob("accelerate-*.dist-info"))


@pytest.fixture(scope="module")
def dist(accel_dist: Path, tmp_path_factory) -> Path:
    """The accel wheels (the README's build, conftest.py's ``accel_dist``, shared with test_wheels.py) and the
    shim's (its README's `uv build packages/accelerate`), in a folder of their own."""
    folder = tmp_path_factory.mktemp("shim") / "dist"
    shutil.copytree(accel_dist, folder)
    subprocess.run(["uv", "build", "packages/accelerate", "-q", "-o", str(folder)], cwd=REPO, check=True, timeout=600)
    return folder


@pytest.mark.slow
def test_the_shim_wheel_declares_its_name_version_and_dependency(dist):
    (wheel,) = dist.glob("accelerate-*.whl")
    assert wheel.name == f"accelerate-{SHIM_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"accelerate-{SHIM_VERSION}.dist-info/METADATA").decode()
        entry_points = archive.read(f"accelerate-{SHIM_VERSION}.dist-info/entry_points.txt").decode()
    assert {"accelerate/__init__.py", "accelerate/_aliasing.py", "accelerate/py.typed"} <= set(names)
    assert f"accelerate-{SHIM_VERSION}.dist-info/licenses/LICENSE" in names
    requires = [
        Requirement(line.split(": ", 1)[1]) for line in metadata.splitlines() if line.startswith("Requires-Dist")
    ]
    assert [str(r) for r in requires] == ["accel==0.1.0"]
    assert "accelerate = accel.cli:main" in entry_points


@pytest.mark.slow
def test_the_shim_is_accel_and_replaces_or_is_replaced_by_accelerate(dist, constraints, tmp_path):
    venv = Environment(tmp_path / "venv", dist, constraints)
    shim_line = ["uv", "pip", "install", "--find-links", str(dist), f"accelerate=={SHIM_VERSION}"]

    # On: the shim (and accel, its dependency, from the wheels).
    venv.command(shim_line)
    shim = venv.probe()
    assert shim == {
        "distributions": [SHIM_VERSION],
        "version": ACCELERATE,
        "light": True,
        "memory_module": "accel.utils.memory",
        "same_object": True,
        "accelerator_class": "accel_core.accelerator.accelerator.Accelerator",
        "accel_installed": True,
    }, shim
    assert venv.accelerate_records() == [f"accelerate-{SHIM_VERSION}.dist-info"]
    assert "accel launch" in venv.command([str(venv.python.parent / "accelerate"), "--help"])

    # `accelerate==1.15.0` is satisfied by the shim (PEP 440: a specifier without a local label matches any local
    # label), so a framework's pin does not drop the shim: nothing changes.
    kept = venv.command(["uv", "pip", "install", f"accelerate=={ACCELERATE}"])
    assert venv.accelerate_records() == [f"accelerate-{SHIM_VERSION}.dist-info"], kept

    # Off with uv (docs/frameworks.md's line): Hugging Face's Accelerate replaces the shim, and is itself.
    replaced = venv.command(["uv", "pip", "install", "--reinstall-package", "accelerate", f"accelerate=={ACCELERATE}"])
    assert f"- accelerate=={SHIM_VERSION}" in replaced and f"+ accelerate=={ACCELERATE}" in replaced, replaced
    real = venv.probe()
    assert real["distributions"] == [ACCELERATE] and real["version"] == ACCELERATE, real
    assert real["memory_module"] == "accelerate.utils.memory" and not real["same_object"], real
    assert real["accelerator_class"] == "accelerate.accelerator.Accelerator", real
    assert venv.accelerate_records() == [f"accelerate-{ACCELERATE}.dist-info"]
    assert not (venv.site_packages / "accelerate" / "_aliasing.py").exists()

    # On again with pip: pip uninstalls Accelerate first (one distribution of the name), then installs the shim.
    pip = [str(venv.python), "-m", "pip", "install", "--no-deps", "--no-index", "--find-links", str(dist)]
    switched = venv.command([*pip, f"accelerate=={SHIM_VERSION}"])
    assert f"Successfully uninstalled accelerate-{ACCELERATE}" in switched, switched
    assert venv.accelerate_records() == [f"accelerate-{SHIM_VERSION}.dist-info"]
    assert not (venv.site_packages / "accelerate" / "accelerator.py").exists(), "Accelerate's files were left"
    assert venv.probe() == shim

    # Off with pip: the reverse.
    off = ["install", "--force-reinstall", "--no-deps", f"accelerate=={ACCELERATE}"]
    switched = venv.command([str(venv.python), "-m", "pip", *off])
    assert f"Successfully uninstalled accelerate-{SHIM_VERSION}" in switched, switched
    assert venv.accelerate_records() == [f"accelerate-{ACCELERATE}.dist-info"]
    assert venv.probe()["accelerator_class"] == "accelerate.accelerator.Accelerator"
