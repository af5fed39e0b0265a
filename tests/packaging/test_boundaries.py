"""The dependency rule of DESIGN.md, checked on the sources: every distribution except the meta-package `accel`
depends on accel-core and on no other accel distribution, in its pyproject.toml (dependencies and extras) and in
what its code imports; accel-core imports no backend, no tracker library and no other accel package.

When one package needs another's service (a backend saving its shards inside accel-checkpoint's folder), the
contract lives in accel-core and the caller hands the service over through it (``accel_core.checkpointing``).
Fast: reads files and parses them, imports nothing."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli before 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.name for p in (REPO / "packages").iterdir() if (p / "pyproject.toml").exists())
META = "accel"
CORE = "accel-core"
# The declared exception: the opt-in `accelerate` shim (docs/frameworks.md) answers `import accelerate.<path>` with
# the meta-package's modules, so it depends on `accel` (exactly) and imports `accel`, as a user's script does, and no
# accel package beneath it. test_the_shim_depends_on_the_meta_package_alone checks that.
SHIM = "accelerate"
# Import name of each distribution (accel-fsdp -> accel_fsdp).
MODULE_OF = {package: package.replace("-", "_") for package in PACKAGES}
BACKEND_LIBRARIES = {"deepspeed", "megatron", "torch_xla", "transformer_engine", "intel_transformer_engine", "torchao"}
# accel-tracking's libraries (its extras, checked below to be all here) and other trackers Accelerate knows.
TRACKER_LIBRARIES = {
    "tensorboard",
    "tensorboardX",
    "torch.utils.tensorboard",
    "wandb",
    "mlflow",
    "comet_ml",
    "aim",
    "clearml",
    "dvclive",
    "swanlab",
    "trackio",
    "tqdm",
    "matplotlib",
}
# Imports of a backend library that accel-core still makes, each with why; an entry that is no longer needed fails
# (remove it). (file under packages/accel-core/src, library) -> why.
CORE_EXCEPTIONS = {
    ("accel_core/compat/availability.py", "torch_xla"): (
        "is_torch_xla_available(check_is_tpu=...) asks an installed torch-xla which device it runs on (Accelerate's "
        "probe); False without it"
    ),
    ("accel_core/compat/availability.py", "transformer_engine"): (
        "is_transformer_engine_mxfp8_available() asks an installed Transformer-Engine (Accelerate's probe)"
    ),
}


def _project(package: str) -> dict:
    with open(REPO / "packages" / package / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def _requirements(package: str) -> list[tuple[str, Requirement]]:
    """(where, requirement) for the dependencies and every extra of ``package``."""
    project = _project(package)
    found = [("dependencies", Requirement(text)) for text in project.get("dependencies", [])]
    for extra, texts in project.get("optional-dependencies", {}).items():
        found += [(f"extra [{extra}]", Requirement(text)) for text in texts]
    return found


def _imports(package: str) -> list[tuple[str, int, str]]:
    """(file under src/, line, module) of every import in ``package``'s sources: at the top, inside functions and
    under ``TYPE_CHECKING`` alike, and ``importlib.import_module("...")`` / ``__import__("...")`` of a literal name.
    Relative imports stay inside the package and are left out."""
    src = REPO / "packages" / package / "src"
    found = []
    for path in sorted(src.rglob("*.py")):
        where = path.relative_to(src).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found += [(where, node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((where, node.lineno, node.module))
                found += [(where, node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                    found.append((where, node.lineno, node.args[0].value))
    return found


def _is_in(module: str, roots: set[str]) -> bool:
    return _root_in(module, roots) is not None


def _root_in(module: str, roots: set[str]) -> str | None:
    """The entry of ``roots`` that ``module`` is, or is inside of (``torch_xla`` for ``torch_xla.runtime``)."""
    return next((root for root in roots if module == root or module.startswith(f"{root}.")), None)


def test_the_scan_sees_the_imports_it_checks():
    # A scan that found nothing would pass every rule below.
    modules = {module for _, _, module in _imports("accel-fsdp")}
    assert "accel_core.optimizer_rebuild" in modules and "torch.distributed.checkpoint" in modules
    assert {("accel-deepspeed", "deepspeed")} <= {(p, m.split(".")[0]) for p in PACKAGES for _, _, m in _imports(p)}
    assert ("accel_xla/runtime.py", "torch_xla") in {(w, m) for w, _, m in _imports("accel-xla")}


@pytest.mark.parametrize("package", [p for p in PACKAGES if p not in (META, SHIM)])
def test_a_distribution_depends_on_no_accel_distribution_but_accel_core(package):
    ours = {canonicalize_name(p) for p in PACKAGES}
    allowed = {canonicalize_name(CORE), canonicalize_name(package)}  # an extra may name the package's own extras
    if package == CORE:
        allowed = {canonicalize_name(CORE)}
    requirements = _requirements(package)
    wrong = [f"{where}: {r}" for where, r in requirements if canonicalize_name(r.name) in ours - allowed]
    assert not wrong, (
        f"packages/{package}/pyproject.toml lists accel distributions other than accel-core: {wrong}. Declare the "
        "contract in accel-core and let the caller hand the service over (DESIGN.md, 'The dependency rule')."
    )
    if package != CORE:
        depends = {canonicalize_name(r.name) for where, r in requirements if where == "dependencies"}
        assert CORE in depends, f"packages/{package}/pyproject.toml must depend on accel-core"


@pytest.mark.parametrize("package", [p for p in PACKAGES if p not in (META, SHIM)])
def test_a_distribution_imports_no_accel_package_but_accel_core(package):
    others = {MODULE_OF[p] for p in PACKAGES} - {MODULE_OF[CORE], MODULE_OF[package]}
    # A backend reads and writes its shards through the CheckpointIO accel-checkpoint hands it, never importing it.
    wrong = [f"{where}:{line} {module}" for where, line, module in _imports(package) if _is_in(module, others)]
    assert not wrong, f"{package} imports other accel packages (only accel_core is allowed): {wrong}"


def test_the_shim_depends_on_the_meta_package_alone():
    assert SHIM in PACKAGES
    ours = {canonicalize_name(p) for p in PACKAGES}
    accel_requirements = [str(r) for _, r in _requirements(SHIM) if canonicalize_name(r.name) in ours]
    assert accel_requirements == [f"{META}=={_project(META)['version']}"], accel_requirements
    imported = {module.split(".")[0] for _, _, module in _imports(SHIM)}
    assert imported & {MODULE_OF[p] for p in PACKAGES} == {META}, imported
    assert imported <= {META, "__future__", "importlib", "sys", "types", "typing"}, imported  # no torch: stays light


def test_accel_core_imports_no_backend_and_no_tracker_library():
    forbidden = BACKEND_LIBRARIES | TRACKER_LIBRARIES
    seen = {(where, _root_in(module, forbidden)) for where, _, module in _imports(CORE) if _is_in(module, forbidden)}
    wrong = sorted(seen - set(CORE_EXCEPTIONS))
    assert not wrong, (
        f"accel-core imports a backend or tracker library: {wrong}. The backend's own distribution does that, "
        "reached through a contract declared in accel-core (a Strategy, an entry point)."
    )
    stale = sorted(set(CORE_EXCEPTIONS) - seen)
    assert not stale, f"accel-core no longer makes these imports: remove them from CORE_EXCEPTIONS: {stale}"


def test_the_tracker_list_covers_accel_trackings_libraries():
    # Each extra of accel-tracking installs tracker libraries; core must not import any of them.
    libraries = {
        canonicalize_name(requirement.name).replace("-", "_")
        for _, requirement in _requirements("accel-tracking")
        if canonicalize_name(requirement.name) not in {canonicalize_name(p) for p in PACKAGES}
    }
    assert libraries and libraries <= TRACKER_LIBRARIES, sorted(libraries - TRACKER_LIBRARIES)
