"""mkdocs hook: the generated reference pages, and the docstring check of the public API.

- ``reference/api/<module>.md`` for ``accel`` and ``accel.utils``: one section per name of the
  module's ``_EXPORTS`` table (plus the submodules in its ``__all__``), so a name added to the table
  appears without touching the docs. Each section is rendered by mkdocstrings from the module that
  defines the object.
- ``reference/cli.md``: the output of ``accel --help`` and ``accel <command> --help`` for every
  command of ``accel.cli.COMMANDS``, run as a user runs them.
- A public name, or a public method / property of a public class, without a docstring is a
  warning, so ``mkdocs build --strict`` fails on it.

The page builders need neither mkdocs nor torch at import time: tests/docs reads them directly.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

# The modules whose names are the public API, each documented on its own page.
PUBLIC_MODULES = ("accel", "accel.utils")
API_DIR = "reference/api"
CLI_PAGE = "reference/cli.md"
# mkdocstrings options of each object: its own heading (with the signature) under ours, out of the toc.
OBJECT_OPTIONS = (
    "show_root_heading: true",
    "show_root_toc_entry: false",
    "show_root_full_path: false",
    "heading_level: 3",
)

log = logging.getLogger(f"mkdocs.plugins.{__name__}")


@dataclass(frozen=True)
class Entry:
    """One public name: ``public`` (``accel.Accelerator``) and where mkdocstrings reads it (``target``)."""

    public: str
    target: str
    is_module: bool


def public_names(module_name: str) -> list[str]:
    """The names ``module_name`` exports: its ``_EXPORTS`` table, then submodules listed in ``__all__``."""
    module = importlib.import_module(module_name)
    exports: dict[str, str] = module._EXPORTS
    return [*exports, *(name for name in module.__all__ if name not in exports)]


def entries(module_name: str) -> list[Entry]:
    """Resolves each public name of ``module_name`` to the object it gives (this imports torch)."""
    module = importlib.import_module(module_name)
    found = []
    for name in public_names(module_name):
        value = getattr(module, name)
        if inspect.ismodule(value):
            found.append(Entry(f"{module_name}.{name}", value.__name__, is_module=True))
            continue
        where, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if not where or not qualname:
            # A constant (a string, a list): the module its _EXPORTS entry names holds it as an attribute,
            # documented by the string literal under its assignment.
            where, qualname = module._EXPORTS.get(name), name
            if not where or not hasattr(importlib.import_module(where), name):
                raise ValueError(
                    f"{module_name}.{name}: not an object with __qualname__ nor an attribute of its _EXPORTS module"
                )
        found.append(Entry(f"{module_name}.{name}", f"{where}.{qualname}", is_module=False))
    return found


def page_name(module_name: str) -> str:
    return f"{API_DIR}/{module_name}.md"


def api_pages() -> dict[str, str]:
    """``{page path: Markdown}`` for every public module; an object is rendered once, then linked."""
    pages: dict[str, str] = {}
    rendered: dict[str, Entry] = {}  # target -> the entry that rendered it
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        doc = inspect.cleandoc(module.__doc__ or "")
        lines = [f"# `{module_name}`", "", doc, ""]
        for entry in entries(module_name):
            short = entry.public.rsplit(".", 1)[1]
            lines += [f"## `{entry.public}` {{ #{entry.public} }}", ""]
            if entry.is_module and entry.target in PUBLIC_MODULES:
                lines += [f"The module [`{entry.target}`]({os.path.basename(page_name(entry.target))}).", ""]
                continue
            first = rendered.get(entry.target)
            if first is not None:
                first_page = os.path.basename(page_name(first.public.rsplit(".", 1)[0]))
                lines += [f"The same object as [`{first.public}`]({first_page}#{first.public}).", ""]
                continue
            rendered[entry.target] = entry
            if entry.is_module:
                lines += [f"`import {entry.public}`", ""]
            else:
                defined = entry.target.rsplit(".", 1)[0]
                lines += [f"`from {module_name} import {short}` (defined in `{defined}`)", ""]
            lines += [f"::: {entry.target}", "    options:", *(f"      {option}" for option in OBJECT_OPTIONS), ""]
        pages[page_name(module_name)] = "\n".join(lines)
    return pages


def _help(*argv: str) -> str:
    """``accel <argv>`` as a user runs it: a clean environment (no ACCEL_*, an empty config dir), 100 columns."""
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
        env.update(XDG_CONFIG_HOME=home, COLUMNS="100", NO_COLOR="1", PYTHON_COLORS="0")
        command = [sys.executable, "-m", "accel.cli", *argv]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"accel {' '.join(argv)} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout.rstrip()


def cli_page() -> str:
    """The CLI reference: ``accel --help``, then each command's ``--help``."""
    from accel.cli import COMMANDS

    lines = [
        "# Command line",
        "",
        "Generated from the parsers at build time: what `accel --help` and `accel <command> --help` print",
        "(with no config file and no `ACCEL_*` variable set; backend flags come from the installed backends).",
        "",
        "## `accel`",
        "",
        "```text",
        _help("--help"),
        "```",
        "",
    ]
    for command, summary in COMMANDS.items():
        lines += [f"## `accel {command}`", "", summary[:1].upper() + summary[1:] + ".", "", "```text"]
        lines += [_help(command, "--help"), "```", ""]
    return "\n".join(lines)


def undocumented() -> list[str]:
    """Public names, and public functions / properties of public classes, that have no docstring.

    Read statically with griffe (as mkdocstrings reads them): a dataclass's generated ``__doc__``
    does not count.
    """
    import griffe

    loader = griffe.GriffeLoader()
    packages: dict[str, Any] = {}  # GriffeLoader.load parses again on every call
    missing = []
    for module_name in PUBLIC_MODULES:
        for entry in entries(module_name):
            package, _, rest = entry.target.partition(".")
            loaded = packages.get(package) or packages.setdefault(package, loader.load(package))
            obj: Any = loaded[rest] if rest else loaded
            if not obj.docstring:
                missing.append(f"{entry.public} ({entry.target})")
            if not obj.is_class:
                continue
            for name, member in obj.all_members.items():  # inherited ones too: the Accelerator's mixins
                target = member.final_target if member.is_alias else member
                if name.startswith("_") or not target.path.startswith("accel"):  # not torch's, say
                    continue
                if (target.is_function or "property" in target.labels) and not target.docstring:
                    missing.append(f"{entry.public}.{name} ({target.path})")
    return sorted(set(missing))


# -- mkdocs events ----------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    generated = {**api_pages(), CLI_PAGE: cli_page()}
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    for name in undocumented():
        log.warning(f"public name without a docstring: {name} (add one: the API reference shows it)")
    return files


def on_page_content(html: str, **kwargs: Any) -> str:
    # Docstrings end a paragraph with reStructuredText's "::" before an example block; show one colon.
    return re.sub(r"::</p>", ":</p>", html)
