"""Writes reference_surface.json: the public names of Hugging Face Accelerate that scripts use.

Run once by hand (not in CI) against the released wheel, unpacked (the released 1.15.0 has names the
development tree before it lacks, ``utils.get_model_tp_size`` for one), or a bare clone of
huggingface/accelerate at a revision; files are parsed with ``ast`` (nothing of Accelerate is imported):

    pip download accelerate==1.15.0 --no-deps -d /tmp/ref && unzip -q /tmp/ref/*.whl -d /tmp/ref/whl
    python tests/compat/gen_reference_surface.py /tmp/ref/whl
    python tests/compat/gen_reference_surface.py /work/.mirror/huggingface+accelerate/repo [REV]

Sections (each a sorted list of dotted names):
- ``accelerate``: the names ``accelerate/__init__.py`` binds (its top-level API);
- ``accelerate.utils``: the names ``accelerate/utils/__init__.py`` binds (conditional imports included);
- ``accelerate.utils.<Enum>.<MEMBER>``: the members of the enums ``accelerate.utils`` exports;
- ``accelerate.Accelerator``: public methods and properties, public attributes set in ``__init__``,
  and the constructor's arguments (``accelerate.Accelerator(<argument>)``);
- ``accelerate.PartialState``, ``accelerate.AcceleratorState``, ``accelerate.GradientState``: the same
  for the state classes;
- ``accelerate.logging`` and ``accelerate.local_sgd``: module-level public names, plus
  ``LocalSGD``'s methods and constructor arguments;
- ``accelerate modules``: the module paths scripts import from (``accelerate.state``,
  ``accelerate.utils.operations``, ...), each with the public names it defines; for ``utils``'
  submodules only those ``accelerate.utils`` exports (the rest are the module's own helpers);
- ``defaults``: ``{"accelerate.X(argument)": default}`` for the functions and classes of ``accelerate`` and
  ``accelerate.utils`` (constructor, or dataclass fields) and the ``Accelerator``'s methods, where the
  default is a literal (a string, number, bool or None).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

OUTPUT = Path(__file__).with_name("reference_surface.json")


def show(repo: str, rev: str, path: str) -> str:
    """The text of ``path`` (``src/accelerate/...``) at ``rev`` of a bare clone, or in an unpacked wheel."""
    unpacked = Path(repo) / path.removeprefix("src/")
    if (Path(repo) / "accelerate" / "__init__.py").is_file():
        return unpacked.read_text()
    return subprocess.run(
        ["git", f"--git-dir={repo}", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True
    ).stdout


def describe(repo: str, rev: str) -> dict[str, str]:
    """Where the names come from: the wheel's file name, or the clone's commit."""
    if (Path(repo) / "accelerate" / "__init__.py").is_file():
        wheel = next(Path(repo).glob("accelerate-*.dist-info")).name.removesuffix(".dist-info")
        return {"repository": "huggingface/accelerate", "distribution": f"{wheel}-py3-none-any.whl"}
    commit = subprocess.run(
        ["git", f"--git-dir={repo}", "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {"repository": "huggingface/accelerate", "commit": commit}


def bound_by_imports(source: str) -> list[str]:
    """Names a module binds with ``from x import a, b as c`` anywhere (inside ``if`` blocks too), public only."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                name = alias.asname or alias.name
                if not name.startswith("_"):
                    names.add(name)
    return sorted(names)


def module_public_names(source: str) -> list[str]:
    """Public functions, classes and assignments at a module's top level."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return sorted(n for n in names if not n.startswith("_") and n != "logger")


def module_paths(repo: str, rev: str, utils: set[str]) -> list[str]:
    """``accelerate.<module>`` and ``accelerate.utils.<module>``, each followed by the names it defines."""
    names = []
    for package, only in (("accelerate", None), ("accelerate/utils", utils)):
        for module in list_modules(repo, rev, f"src/{package}"):
            if module in ("__init__", "logging", "local_sgd"):  # logging and local_sgd have sections of their own
                continue
            dotted = f"{package.replace('/', '.')}.{module}"
            defined = module_public_names(show(repo, rev, f"src/{package}/{module}.py"))
            names += [dotted] + [f"{dotted}.{n}" for n in defined if only is None or n in only]
    return names


def list_modules(repo: str, rev: str, folder: str) -> list[str]:
    """The ``.py`` modules directly in ``folder`` (``src/accelerate/...``), without the suffix."""
    unpacked = Path(repo) / folder.removeprefix("src/")
    if (Path(repo) / "accelerate" / "__init__.py").is_file():
        return sorted(p.stem for p in unpacked.glob("*.py"))
    listing = subprocess.run(
        ["git", f"--git-dir={repo}", "ls-tree", "--name-only", f"{rev}:{folder}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(n.removesuffix(".py") for n in listing if n.endswith(".py"))


def _literal_defaults(function: ast.FunctionDef) -> dict[str, ast.expr]:
    arguments = function.args
    positional = arguments.posonlyargs + arguments.args
    found = dict(
        zip((a.arg for a in positional[len(positional) - len(arguments.defaults) :]), arguments.defaults, strict=True)
    )
    found.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d is not None})
    return found


def _dataclass_defaults(cls: ast.ClassDef) -> dict[str, ast.expr]:
    found: dict[str, ast.expr] = {}
    for statement in cls.body:
        if (
            isinstance(statement, ast.AnnAssign)
            and statement.value is not None
            and isinstance(statement.target, ast.Name)
        ):
            value = statement.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) == "field":
                keywords = {k.arg: k.value for k in value.keywords}
                if "default" in keywords:
                    found[statement.target.id] = keywords["default"]
            else:
                found[statement.target.id] = value
    return found


def defaults(repo: str, rev: str, exported: dict[str, str]) -> dict[str, object]:
    """Literal defaults of ``exported`` (name -> its reference prefix) and of the Accelerator's methods."""
    definitions: dict[str, ast.FunctionDef | ast.ClassDef] = {}
    for package in ("accelerate", "accelerate/utils"):
        for module in list_modules(repo, rev, f"src/{package}"):
            for node in ast.parse(show(repo, rev, f"src/{package}/{module}.py")).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in exported:
                    definitions.setdefault(node.name, node)
    found: dict[str, ast.expr] = {}
    for name, node in definitions.items():
        prefix = exported[name]
        if isinstance(node, ast.FunctionDef):
            items = _literal_defaults(node)
        else:
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            items = _literal_defaults(init) if init is not None else _dataclass_defaults(node)
            if name == "Accelerator":
                for method in node.body:
                    if isinstance(method, ast.FunctionDef) and not method.name.startswith("_"):
                        found.update({f"{prefix}.{method.name}({k})": d for k, d in _literal_defaults(method).items()})
        found.update({f"{prefix}({k})": d for k, d in items.items()})
    literal: dict[str, object] = {}
    for key, node in sorted(found.items()):
        try:
            value = ast.literal_eval(node)
        except ValueError:
            continue
        if value is None or isinstance(value, (str, int, float, bool)):
            literal[key] = value
    return literal


def find_class(source: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == name)


def class_surface(cls: ast.ClassDef, prefix: str) -> list[str]:
    """Public methods and properties, public ``self.x`` set in ``__init__``, and constructor arguments."""
    names = {f"{prefix}.{n.name}" for n in cls.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        for node in ast.walk(init):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and not node.attr.startswith("_")
            ):
                names.add(f"{prefix}.{node.attr}")
        arguments = init.args.posonlyargs + init.args.args[1:] + init.args.kwonlyargs
        names.update(f"{prefix}({a.arg})" for a in arguments)
    return sorted(names)


def enum_members(source: str, exported: set[str]) -> list[str]:
    """``accelerate.utils.<Enum>.<MEMBER>`` for the enums of dataclasses.py that utils exports."""
    names = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef) or node.name not in exported:
            continue
        bases = {ast.unparse(b) for b in node.bases}
        if not bases & {"enum.Enum", "BaseEnum", "str, enum.Enum"} and not any("Enum" in b for b in bases):
            continue
        for statement in node.body:
            if isinstance(statement, ast.Assign):
                names += [f"accelerate.utils.{node.name}.{t.id}" for t in statement.targets if isinstance(t, ast.Name)]
    return sorted(names)


def main(repo: str, rev: str = "HEAD") -> None:
    source = describe(repo, rev)
    commit = source.get("commit", rev)
    init = show(repo, commit, "src/accelerate/__init__.py")
    version = next(line.split('"')[1] for line in init.splitlines() if line.startswith("__version__"))
    utils = bound_by_imports(show(repo, commit, "src/accelerate/utils/__init__.py"))
    local_sgd = show(repo, commit, "src/accelerate/local_sgd.py")
    state = show(repo, commit, "src/accelerate/state.py")
    surface = {
        "reference": {**source, "version": version},
        "accelerate": [f"accelerate.{n}" for n in bound_by_imports(init)],
        "accelerate.utils": [f"accelerate.utils.{n}" for n in utils],
        "accelerate.utils enum members": enum_members(
            show(repo, commit, "src/accelerate/utils/dataclasses.py"), set(utils)
        ),
        "accelerate.Accelerator": class_surface(
            find_class(show(repo, commit, "src/accelerate/accelerator.py"), "Accelerator"), "accelerate.Accelerator"
        ),
        **{
            f"accelerate.{name}": class_surface(find_class(state, name), f"accelerate.{name}")
            for name in ("PartialState", "AcceleratorState", "GradientState")
        },
        "accelerate.logging": [
            f"accelerate.logging.{n}" for n in module_public_names(show(repo, commit, "src/accelerate/logging.py"))
        ],
        "accelerate.local_sgd": [f"accelerate.local_sgd.{n}" for n in module_public_names(local_sgd)]
        + class_surface(find_class(local_sgd, "LocalSGD"), "accelerate.local_sgd.LocalSGD"),
        "accelerate modules": module_paths(repo, commit, set(utils)),
    }
    exported = {n: f"accelerate.utils.{n}" for n in utils} | {n: f"accelerate.{n}" for n in bound_by_imports(init)}
    surface["defaults"] = defaults(repo, commit, exported)  # a mapping, where the other sections are lists
    OUTPUT.write_text(json.dumps(surface, indent=1) + "\n")
    counts = {k: len(v) for k, v in surface.items() if k != "reference"}
    print(f"wrote {OUTPUT} from {source} (version {version}): {counts}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
