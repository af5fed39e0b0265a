"""The release rule of CONTRIBUTING.md, checked: each distribution's version (pyproject.toml and
``__version__``) is its changelog's newest released entry, and the pins between the distributions
admit the versions in the workspace and stop before the next minor."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli before 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.name for p in (REPO / "packages").iterdir() if (p / "pyproject.toml").exists())
# "## [Unreleased]" or "## [1.2.3] - 2026-11-29", Keep a Changelog's headings.
# The opt-in `accelerate` shim (docs/frameworks.md): its version is "<Accelerate API level>+accel.<accel version>",
# its `__version__` the Accelerate API level alone (the frameworks compare it with Accelerate's releases), and it pins
# the meta-package exactly (its modules are what `accelerate.<path>` resolves to).
SHIM = "accelerate"
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$", re.M)


def _project(package: str) -> dict:
    with open(REPO / "packages" / package / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def _releases(package: str) -> list[tuple[str, str | None]]:
    text = (REPO / "packages" / package / "CHANGELOG.md").read_text()
    return [(m["name"], m["date"]) for m in HEADING.finditer(text)]


@pytest.mark.parametrize("package", PACKAGES)
def test_version_is_the_newest_changelog_entry(package: str) -> None:
    path = REPO / "packages" / package / "CHANGELOG.md"
    assert path.exists(), f"{package} has no CHANGELOG.md (see CONTRIBUTING.md, 'Releases')"
    releases = _releases(package)
    assert releases and releases[0] == ("Unreleased", None), f"{path}: the first entry must be '## [Unreleased]'"
    released = releases[1:]
    assert released, f"{path}: no released version"
    for name, date in released:
        assert date is not None, f"{path}: '## [{name}]' needs its date: '## [{name}] - YYYY-MM-DD'"
        Version(name)  # raises InvalidVersion on a malformed heading
    versions = [Version(name) for name, _ in released]
    assert versions == sorted(versions, reverse=True), f"{path}: entries must go from newest to oldest"
    version = _project(package)["version"]
    assert released[0][0] == version, (
        f"{package}: pyproject.toml says {version}, CHANGELOG.md's newest release is {released[0][0]}; "
        "move the Unreleased notes under the new version in the commit that bumps it"
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_dunder_version_matches_pyproject(package: str) -> None:
    module = package.replace("-", "_")
    init = (REPO / "packages" / package / "src" / module / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', init, re.M)
    assert match is not None, f"{module} defines no __version__ (CONTRIBUTING.md, 'Releases')"
    version = _project(package)["version"]
    if package == SHIM:
        assert Version(version).local == f"accel.{_project('accel')['version']}", f"{SHIM}: {version} must name accel's"
        version = Version(version).public
    assert match.group(1) == version, f"{module}.__version__ differs from pyproject.toml"


def test_pins_between_distributions_admit_the_workspace_versions_up_to_the_next_minor() -> None:
    versions = {package: Version(_project(package)["version"]) for package in PACKAGES}
    checked = 0
    for package in PACKAGES:
        project = _project(package)
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
        for text in requirements:
            requirement = Requirement(text)
            if requirement.name not in versions or requirement.name == package:
                continue
            current = versions[requirement.name]
            if package == SHIM:
                assert str(requirement.specifier) == f"=={current}", f"{SHIM}: pin {requirement.name}=={current}"
                continue
            assert current in requirement.specifier, (
                f"{package}: {text} excludes the workspace's {requirement.name} {current}"
            )
            next_minor = Version(f"{current.major}.{current.minor + 1}")
            uppers = [Version(s.version) for s in requirement.specifier if s.operator == "<"]
            assert uppers == [next_minor], f"{package}: {text} must stop at <{next_minor} (the next minor of {current})"
            checked += 1
    assert checked >= 10  # the meta-package alone pins seven siblings
