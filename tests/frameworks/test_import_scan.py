"""Every ``accelerate`` name that the installed transformers, TRL, PEFT and diffusers import resolves under accel.

The frameworks' sources are read, never imported (they import the real ``accelerate``): every
``from accelerate[.x] import name``, ``import accelerate[.x]`` and ``accelerate.x.name`` attribute use,
module-level or inside functions and ``if is_accelerate_available()`` blocks, is collected and
checked against accel's module of the same path (``accelerate.utils.memory.clear_device_cache`` ->
``accel.utils.memory.clear_device_cache``). A framework's new release that imports a name accel
lacks fails this test, naming it.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

FRAMEWORKS = ("transformers", "trl", "peft", "diffusers")


@dataclass(frozen=True, order=True)
class AccelerateName:
    """One use: ``name`` in ``module`` (dotted, starting with ``accelerate``; a module, or a class such as
    ``accelerate.utils.CustomDtype`` for ``CustomDtype.INT4``); ``name`` empty for a bare ``import module``."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


def _attribute_chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything that is not names joined by dots."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def scan_source(source: str) -> set[AccelerateName]:
    """The accelerate names one Python source uses."""
    tree = ast.parse(source)
    found: set[AccelerateName] = set()
    bound: dict[str, str] = {}  # local name -> the accelerate path it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "accelerate" or node.module.startswith("accelerate."):
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    found.add(AccelerateName(node.module, alias.name))
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "accelerate" or alias.name.startswith("accelerate."):
                    found.add(AccelerateName(alias.name, ""))
                    # `import accelerate.utils` binds `accelerate`; `import accelerate.utils as u` binds the module.
                    bound[alias.asname or "accelerate"] = alias.name if alias.asname else "accelerate"
    # Attribute uses on those names: `accelerate.utils.foo`, `hooks.add_hook_to_module` after
    # `from accelerate import hooks`, `CustomDtype.INT4`. Only the whole chain is recorded (`a.b.c`, not `a.b`):
    # checking it checks every step.
    chains: set[str] = set()
    for node in ast.walk(tree):
        chain = _attribute_chain(node) if isinstance(node, ast.Attribute) else None
        if chain and chain[0] in bound:
            chains.add(".".join([bound[chain[0]], *chain[1:]]))
    prefixes = {chain.rpartition(".")[0] for chain in chains}
    for chain in chains - prefixes:
        module, _, name = chain.rpartition(".")
        found.add(AccelerateName(module, name))
    return _without_duplicates(found)


def _without_duplicates(found: set[AccelerateName]) -> set[AccelerateName]:
    """One entry per dotted name (``import accelerate.hooks`` and ``accelerate.hooks`` in an expression)."""
    by_name: dict[str, AccelerateName] = {}
    for use in sorted(found):
        by_name.setdefault(str(use), use)
    return set(by_name.values())


def framework_sources() -> Iterator[tuple[str, str, Path]]:
    """``(framework, version, file)`` for every Python file of the installed frameworks (found, not imported).

    ``ACCEL_FRAMEWORKS_SITE`` names another environment's site-packages folder to read them from instead:
    tests/frameworks/run.sh scans the frameworks' environment (where the shim is installed) against the
    workspace's accel, which holds every backend's names (``DeepSpeedPlugin`` needs accel-deepspeed).
    """
    import importlib.machinery
    from importlib.metadata import distributions

    site = os.environ.get("ACCEL_FRAMEWORKS_SITE")
    search = [site] if site else None
    installed = {dist.metadata["Name"].lower(): dist.version for dist in distributions(path=search or sys.path)}
    for framework in FRAMEWORKS:
        if site:
            spec = importlib.machinery.PathFinder.find_spec(framework, [site])
        else:
            spec = importlib.util.find_spec(framework)
        if spec is None or not spec.submodule_search_locations:
            continue
        framework_version = installed.get(framework, "?")
        for root in spec.submodule_search_locations:
            for file in sorted(Path(root).rglob("*.py")):
                yield framework, framework_version, file


def scan_frameworks() -> tuple[dict[AccelerateName, set[str]], dict[str, str]]:
    """Every accelerate name used -> the frameworks using it; and the frameworks found -> their versions."""
    uses: dict[AccelerateName, set[str]] = {}
    versions: dict[str, str] = {}
    canonical: dict[str, AccelerateName] = {}
    for framework, framework_version, file in framework_sources():
        versions[framework] = framework_version
        source = file.read_text(encoding="utf-8", errors="replace")
        if "accelerate" not in source:
            continue
        for use in scan_source(source):
            use = canonical.setdefault(str(use), use)  # one entry per dotted name across files
            uses.setdefault(use, set()).add(framework)
    return uses, versions


def resolves(use: AccelerateName) -> bool:
    """Whether accel's module of the same path has the name (``accelerate.a.b`` -> ``accel.a.b``)."""
    module_path = "accel" + use.module[len("accelerate") :]
    parts = module_path.split(".")
    obj = None
    # Import the longest importable prefix, then walk the rest as attributes (`accel.utils.memory` is a module,
    # `accel.Accelerator.gather` an attribute of a class).
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        break
    else:
        return False
    for attribute in rest:
        if not hasattr(obj, attribute):
            return False
        obj = getattr(obj, attribute)
    if not use.name:
        return isinstance(obj, types.ModuleType)
    return hasattr(obj, use.name)


def test_scan_reads_every_import_form() -> None:
    """The scanner finds the forms the frameworks use (a scanner that finds nothing would pass the check below)."""
    source = (
        "import accelerate\n"
        "from accelerate import Accelerator, hooks\n"
        "from accelerate.utils.memory import clear_device_cache as clear\n"
        "if is_accelerate_available():\n"
        "    from accelerate.state import PartialState\n"
        "def f():\n"
        "    import accelerate.utils.modeling\n"
        "    from accelerate.hooks import AlignDevicesHook\n"
        "    return accelerate.utils.modeling.clean_device_map, hooks.remove_hook_from_module, accelerate.__version__\n"
    )
    found = {str(use) for use in scan_source(source)}
    assert found == {
        "accelerate",
        "accelerate.Accelerator",
        "accelerate.hooks",
        "accelerate.utils.memory.clear_device_cache",
        "accelerate.state.PartialState",
        "accelerate.utils.modeling",
        "accelerate.utils.modeling.clean_device_map",
        "accelerate.hooks.AlignDevicesHook",
        "accelerate.hooks.remove_hook_from_module",
        "accelerate.__version__",
    }, found


def test_every_framework_accelerate_name_resolves_under_accel() -> None:
    uses, versions = scan_frameworks()
    if not versions:
        pytest.skip(f"none of {', '.join(FRAMEWORKS)} is installed: nothing to scan")
    checked = sorted(uses)
    missing = [use for use in checked if not resolves(use)]
    found_in = ", ".join(f"{name} {version}" for name, version in sorted(versions.items()))
    print(f"\n{len(checked) - len(missing)} of {len(checked)} accelerate names resolve (scanned {found_in})")
    assert not missing, "accelerate names the frameworks import that accel lacks:\n  " + "\n  ".join(
        f"{use}  (used by {', '.join(sorted(uses[use]))})" for use in missing
    )
