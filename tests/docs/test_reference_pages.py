"""The generated reference pages (docs/hooks/reference.py, run by `mkdocs build`): the API reference
lists exactly the public names of `accel` and `accel.utils`, and the CLI reference is what the
commands print. The strict docs build itself (.ci/run) checks that each entry renders and has a
docstring."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", REPO / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _headings(markdown: str) -> list[str]:
    return re.findall(r"^## `([^`]+)` \{ #\1 \}$", markdown, re.M)


def test_api_reference_lists_exactly_the_public_names(reference: ModuleType) -> None:
    pages = reference.api_pages()
    assert sorted(pages) == ["reference/api/accel.md", "reference/api/accel.utils.md"]
    for module_name in ("accel", "accel.utils"):
        public = importlib.import_module(module_name).__all__
        listed = _headings(pages[f"reference/api/{module_name}.md"])
        assert sorted(listed) == sorted(f"{module_name}.{name}" for name in public), module_name
    # Every object is rendered once (a second `:::` of one object is an ambiguous cross-reference);
    # names exported twice link to the first.
    targets = re.findall(r"^::: (\S+)$", "\n".join(pages.values()), re.M)
    assert len(targets) == len(set(targets))
    assert "::: accel_core.accelerator.accelerator.Accelerator" in pages["reference/api/accel.md"]
    assert (
        "The same object as [`accel.DistributedType`](accel.md#accel.DistributedType)"
        in pages["reference/api/accel.utils.md"]
    )


def test_cli_reference_is_what_each_command_prints(reference: ModuleType) -> None:
    from accel.cli import COMMANDS

    page = reference.cli_page()
    for command in COMMANDS:
        assert f"## `accel {command}`" in page
        assert f"usage: accel {command}" in page, f"accel {command} --help is missing"
    assert "usage: accel <command> [options]" in page
    # Backend flags come from the installed backends' `accel.cli` entry points.
    assert "--use-fsdp" in page and "--use-deepspeed" in page and "--use-megatron" in page


def test_plugin_parameters_show_the_classes_users_import() -> None:
    """The Accelerator's backend settings parameters are `Any` in accel-core (it may not import the backends); the
    reference shows them with the classes of `accel.utils` (docs/hooks/plugin_types.py), and never cites private
    names in the parameters' places."""
    import accel.utils

    source = (REPO / "docs" / "hooks" / "plugin_types.py").read_text()
    table = source.split("ANNOTATIONS: dict[str, dict[str, str]] = ", 1)[1].split("\n}\n", 1)[0] + "\n}"
    annotations_shown = [a for parameters in ast.literal_eval(table).values() for a in parameters.values()]
    assert len(annotations_shown) == 5
    for annotation in annotations_shown:
        for name in set(re.findall(r"\b[A-Z]\w+", annotation)) - {"None"}:
            assert name in accel.utils._EXPORTS, f"{name} is not a name users import from accel.utils"
    # Applied as mkdocstrings applies it (griffe: the docs group, which CI's docs build installs first).
    griffe = pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("docs_plugin_types", REPO / "docs" / "hooks" / "plugin_types.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    loaded = griffe.load("accel_core", extensions=griffe.load_extensions(hook.PluginTypes))
    init = loaded["accelerator.accelerator.Accelerator.__init__"]
    shown = {name: str(init.parameters[name].annotation) for name in hook.ANNOTATIONS[init.path]}
    assert shown == hook.ANNOTATIONS[init.path]
    assert shown["fsdp_plugin"] == "FullyShardedDataParallelPlugin | None"


def test_the_api_reference_text_cites_no_private_name_of_the_reset() -> None:
    """The reference renders the docstrings of accel's public names; `_reset_state()` is Accelerate's private
    method (its test scripts call it), so a docstring does not send users to it."""
    pytest.importorskip("griffe")
    import griffe

    loaded = griffe.load("accel_core")
    cited = []
    for class_path in ("accelerator.accelerator.Accelerator", "state.AcceleratorState", "state.PartialState"):
        cls = loaded[class_path]
        for name, member in [("", cls), *cls.all_members.items()]:
            if name.startswith("_"):
                continue  # private members are not rendered (filters: ["!^_"])
            target = member.final_target if member.is_alias else member
            if target.docstring and "_reset_state" in target.docstring.value:
                cited.append(f"{class_path}.{name}")
    assert cited == [], f"docstrings the reference renders cite _reset_state(): {cited}"
