"""Strategies clean up through ``Strategy.teardown`` only: no exit hooks, finalizers or ``__del__`` of their own.

The Accelerator calls ``teardown`` (``free_memory``, and once at exit from ``accel_core.accelerator.teardown``, the
one exit hook for all of them); a backend's own ``atexit`` hook would run in an order nobody declared (the DeepSpeed
strategy's did, until its release moved into its ``teardown``). Checked on the sources of every package that
registers an ``accel.strategies`` entry point and of accel-core's ``strategies/``. Fast: parses files, imports nothing.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli before 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


def _strategy_sources() -> list[Path]:
    folders = [REPO / "packages" / "accel-core" / "src" / "accel_core" / "strategies"]
    for pyproject in sorted((REPO / "packages").glob("*/pyproject.toml")):
        entry_points = tomllib.loads(pyproject.read_text())["project"].get("entry-points", {})
        if "accel.strategies" in entry_points:
            folders.append(pyproject.parent / "src" / pyproject.parent.name.replace("-", "_"))
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


SOURCES = _strategy_sources()


def exit_hooks(source: str) -> list[str]:
    """``atexit`` imports, ``weakref.finalize`` uses and ``__del__`` methods in ``source``, as 'line: what'."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(alias.name == "atexit" for alias in node.names):
            found.append((node.lineno, "import atexit"))
        elif isinstance(node, ast.ImportFrom) and node.module == "atexit":
            found.append((node.lineno, "from atexit import ..."))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "weakref"
            and any(a.name == "finalize" for a in node.names)
        ):
            found.append((node.lineno, "from weakref import finalize"))
        elif (
            isinstance(node, ast.Attribute) and node.attr == "finalize" and getattr(node.value, "id", None) == "weakref"
        ):
            found.append((node.lineno, "weakref.finalize"))
        elif isinstance(node, ast.FunctionDef) and node.name == "__del__":
            found.append((node.lineno, "def __del__"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_the_strategy_packages_are_all_read() -> None:
    names = {path.relative_to(REPO / "packages").parts[0] for path in SOURCES}
    assert names == {"accel-core", "accel-deepspeed", "accel-fsdp", "accel-megatron", "accel-xla"}, names
    assert REPO / "packages/accel-deepspeed/src/accel_deepspeed/strategy.py" in SOURCES


def test_the_check_finds_each_kind_of_hook() -> None:
    source = "import atexit\nimport weakref\nweakref.finalize(a, f)\nclass A:\n    def __del__(self): ...\n"
    assert exit_hooks(source) == ["1: import atexit", "3: weakref.finalize", "5: def __del__"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO / "packages")))
def test_no_strategy_registers_its_own_exit_hook(path: Path) -> None:
    hooks = exit_hooks(path.read_text())
    assert not hooks, (
        f"{path.relative_to(REPO)} cleans up on its own ({'; '.join(hooks)}): release it in the strategy's "
        "teardown(), which the Accelerator calls from free_memory() and once at exit (accel_core.accelerator.teardown)."
    )
