"""The floors lane tests what the packages declare: every `>=` floor of a dependency is pinned in
tests/floors/constraints.txt (at that version, or the newest patch of that release series), and accel-core's
torch check names the same floor as the packages' requirements."""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli before 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "tests" / "floors" / "constraints.txt"
# Declared but not pinned in the floors lane, each said in constraints.txt: why.
NOT_PINNED = {"packaging", "transformer-engine", "torch-xla"}


def _requirements() -> list[tuple[str, Requirement]]:
    found = []
    for pyproject in sorted((REPO / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        texts = list(project.get("dependencies", []))
        for extra, requirements in project.get("optional-dependencies", {}).items():
            if (pyproject.parent.name, extra) != ("accel-xla", "xla"):  # the pair tests/xla installs and tests
                texts += requirements
        found += [(pyproject.parent.name, Requirement(text)) for text in texts]
    return [(package, r) for package, r in found if not canonicalize_name(r.name).startswith("accel")]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def test_every_declared_floor_is_pinned_in_the_floors_lane():
    pins = _pins()
    checked = 0
    for package, requirement in _requirements():
        name = canonicalize_name(requirement.name)
        floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        if name in NOT_PINNED or not floors:
            continue
        (floor,) = floors
        assert name in pins, f"{package}: {requirement} has no pin in {CONSTRAINTS.name}"
        pin = pins[name]
        assert pin in requirement.specifier, f"{package}: {requirement} refuses the floors lane's {name}=={pin}"
        series = pin.release[: len(floor.release)]
        assert series == floor.release, f"{package}: {requirement}, but the floors lane tests {name}=={pin}"
        checked += 1
    assert checked >= 20


def test_accel_core_checks_the_torch_floor_the_packages_declare():
    from accel_core.torch_floor import MIN_TORCH, require_supported_torch

    floors = {
        str(s.version)
        for _, r in _requirements()
        if canonicalize_name(r.name) == "torch"
        for s in r.specifier
        if s.operator == ">="
    }
    assert floors == {MIN_TORCH}
    require_supported_torch(f"{MIN_TORCH}.0+cpu")
    require_supported_torch(f"{MIN_TORCH}.0a0+git1234")  # a source build of the floor's release counts
    older = f"{Version(MIN_TORCH).major}.{Version(MIN_TORCH).minor - 1}.1+cu121"
    try:
        require_supported_torch(older)
    except ImportError as error:
        assert f'pip install "torch>={MIN_TORCH}"' in str(error) and older in str(error)
    else:
        raise AssertionError(f"torch {older} was accepted")
