"""accel provides every public name of the reference (Accelerate 1.15) that is not in the reviewed allow-list."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # pytest runs with --import-mode=importlib

import surface


def test_allowlist_is_well_formed() -> None:
    data = surface.allowlist()
    seen: Counter[str] = Counter()
    for group in data["missing"]:
        assert group["kind"] in ("not planned", "planned", "internal"), group
        assert group["reason"].strip() and group["names"], group
        seen.update(group["names"])
    for group in data["pending"] or []:
        assert group["branch"] and group["reason"].startswith("pending: being added in branch"), group
        seen.update(group["names"])
    assert not [n for n, count in seen.items() if count > 1], "a name is listed twice"


def test_every_reference_name_is_provided_or_explained() -> None:
    report = surface.compare()
    assert not report.unknown, f"allow-list names that are not reference names (typos?): {report.unknown}"
    assert not report.unexplained, (
        f"{len(report.unexplained)} reference names are missing from accel and not in surface_allowlist.yaml:\n  "
        + "\n  ".join(report.unexplained)
    )
    assert not report.stale, (
        "accel now provides these allow-listed names: remove them from surface_allowlist.yaml "
        "(and regenerate docs/coming_from_accelerate.md):\n  " + "\n  ".join(report.stale)
    )
    print(
        f"\nreference names: {report.total}, provided: {len(report.provided)}, allow-listed: {len(report.allowed)}, "
        f"enum members of allow-listed enums: {len(report.covered_by_enum)}, module copies of allow-listed names: "
        f"{len(report.covered_by_alias)}"
    )


def test_docs_are_current() -> None:
    import gen_coming_from_accelerate as docs

    assert docs.current_page_section() == docs.render(), (
        "docs/coming_from_accelerate.md is out of date with surface_allowlist.yaml: "
        "run python tests/compat/gen_coming_from_accelerate.py"
    )


def test_module_paths_are_light_and_give_accels_objects() -> None:
    """``from accel.state import PartialState`` & co: importing a module path does not import torch, and each name is
    the object accel exports at the top level or in ``accel.utils``."""
    modules = [n.replace("accelerate", "accel", 1) for n in surface.module_paths() if surface.provided(n)]
    code = f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", f"importing the module paths imported torch: {result.stderr}"

    import accel
    import accel.utils

    checked = 0
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            for home in (accel, accel.utils):
                if name in home.__all__:
                    assert getattr(module, name) is getattr(home, name), f"{module_name}.{name}"
                    checked += 1
    assert checked > 200, checked


def test_every_reference_default_is_accels_or_explained() -> None:
    report = surface.compare_defaults()
    assert not report.unknown, f"allow-listed defaults that are not reference defaults (typos?): {report.unknown}"
    assert not report.unexplained, (
        "defaults that differ from the reference's and are not in surface_allowlist.yaml:\n  "
        + (
            "\n  ".join(
                f"{k}: reference {report.differing[k][0]!r}, accel {report.differing[k][1]!r}"
                for k in report.unexplained
            )
        )
    )
    assert not report.stale, (
        f"these defaults are the reference's now: remove them from surface_allowlist.yaml: {report.stale}"
    )
    assert report.compared > 300, report.compared
