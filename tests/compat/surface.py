"""Compares accel's public surface with the reference's (reference_surface.json) and the allow-list.

Used by test_surface.py and by gen_coming_from_accelerate.py. A reference name maps to accel by
replacing ``accelerate`` with ``accel``: ``accelerate.utils.X`` -> ``accel.utils.X``,
``accelerate.Accelerator.m`` -> a member of ``accel.Accelerator`` (or an attribute its instances
set), ``accelerate.Accelerator(arg)`` -> a constructor argument, ``accelerate.utils.E.M`` -> an enum member.
"""

from __future__ import annotations

import importlib
import inspect
import json
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

HERE = Path(__file__).parent
REFERENCE_FILE = HERE / "reference_surface.json"
ALLOWLIST_FILE = HERE / "surface_allowlist.yaml"


def reference_names() -> list[str]:
    data = json.loads(REFERENCE_FILE.read_text())
    return [name for section, names in data.items() if section not in ("reference", "defaults") for name in names]


def reference_info() -> dict[str, str]:
    return json.loads(REFERENCE_FILE.read_text())["reference"]


def allowlist() -> dict[str, Any]:
    return yaml.safe_load(ALLOWLIST_FILE.read_text())


@cache
def _instances() -> dict[str, Any]:
    """An Accelerator, its state objects and a LocalSGD on one CPU process, for the attributes set in ``__init__``."""
    import torch

    from accel import Accelerator, GradientState, PartialState
    from accel.local_sgd import LocalSGD

    accelerator = Accelerator(cpu=True)
    return {
        "Accelerator": accelerator,
        "LocalSGD": LocalSGD(accelerator, torch.nn.Linear(1, 1), 1),
        "PartialState": PartialState(),
        "AcceleratorState": accelerator.state,
        "GradientState": GradientState(),
    }


# Classes whose members (methods, properties, attributes set by __init__) the reference surface lists.
_CLASSES = ("Accelerator", "LocalSGD", "PartialState", "AcceleratorState", "GradientState")


def _resolve(dotted: str) -> Any:
    """``accel.utils.X`` -> the object (importing modules on the way); AttributeError / ImportError if absent."""
    parts = dotted.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        prefix = ".".join(parts[: i + 1])
        if not isinstance(obj, ModuleType):
            obj = getattr(obj, part)
            continue
        try:  # a submodule first: `accel.utils.tqdm.tqdm` is the function of the submodule `tqdm`
            obj = importlib.import_module(prefix)
        except ModuleNotFoundError as error:
            if error.name != prefix:
                raise
            obj = getattr(obj, part)
    return obj


def provided(reference_name: str) -> bool:
    """Whether accel provides the reference's ``reference_name``."""
    name = "accel" + reference_name[len("accelerate") :]
    try:
        if name.endswith(")"):  # accel.X(argument): a constructor argument
            owner, argument = name[:-1].split("(")
            return argument in inspect.signature(_resolve(owner).__init__).parameters
        owner, _, member = name.rpartition(".")
        cls = _resolve(owner) if owner.rsplit(".", 1)[-1] in _CLASSES else None
        if cls is not None:  # a method, property or class attribute, else an attribute set by __init__
            try:
                inspect.getattr_static(cls, member)
                return True
            except AttributeError:
                return member in vars(_instances()[cls.__name__])
        _resolve(name)
        return True
    except (AttributeError, ImportError):
        return False


@dataclass
class Report:
    total: int
    provided: list[str] = field(default_factory=list)
    allowed: dict[str, str] = field(default_factory=dict)  # name -> reason (missing on purpose or pending)
    covered_by_enum: list[str] = field(default_factory=list)
    covered_by_alias: list[str] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)  # missing and not in the allow-list
    stale: list[str] = field(default_factory=list)  # in the allow-list but provided
    unknown: list[str] = field(default_factory=list)  # in the allow-list but not a reference name


def module_paths() -> list[str]:
    """The reference's module paths (``accelerate.state``, ``accelerate.utils.operations``, ...)."""
    names = json.loads(REFERENCE_FILE.read_text())["accelerate modules"]
    return [n for n in names if n.rsplit(".", 1)[0] not in names]  # a module's names follow it, owned by it


def _aliases(name: str) -> tuple[str, ...]:
    """``accelerate.utils.operations.X`` / ``accelerate.big_modeling.X``: the same object as ``accelerate.utils.X``
    or ``accelerate.X``, whose allow-list entry covers it."""
    parts = name.split(".")
    if len(parts) < 3:
        return ()
    return (f"accelerate.{parts[-1]}", f"accelerate.utils.{parts[-1]}")


def compare() -> Report:
    names = reference_names()
    listed: dict[str, str] = {}
    data = allowlist()
    for group in data.get("missing") or []:
        for n in group["names"]:
            listed[n] = f"{group['kind']}: {group['reason']}"
    for group in data.get("pending") or []:
        for n in group["names"]:
            listed[n] = group["reason"]
    report = Report(total=len(names))
    modules = set(module_paths())
    known = set(names)
    report.unknown = sorted(n for n in listed if n not in known)
    for name in names:
        is_provided = provided(name)
        owner = name.rsplit(".", 1)[0]
        if is_provided:
            report.provided.append(name)
            if name in listed:
                report.stale.append(name)
        elif name in listed:
            report.allowed[name] = listed[name]
        elif owner in listed:  # a member of an enum that is itself listed
            report.covered_by_enum.append(name)
        elif owner in modules and any(
            alias in listed for alias in _aliases(name)
        ):  # a module's copy of a listed top-level / utils name
            report.covered_by_alias.append(name)
        else:
            report.unexplained.append(name)
    return report


def _default_of(reference_key: str) -> Any:
    """accel's default for ``accelerate.X(arg)`` / ``accelerate.Accelerator.m(arg)``; ``inspect.Parameter.empty``
    when accel requires the argument, None's stand-in ``_ABSENT`` when accel has no such argument or object."""
    owner, argument = reference_key[:-1].split("(")
    try:
        signature = inspect.signature(_resolve("accel" + owner[len("accelerate") :]))
    except (AttributeError, ImportError, TypeError, ValueError):
        return _ABSENT
    parameter = signature.parameters.get(argument)
    if parameter is None:
        return _ABSENT
    default = parameter.default
    # An enum default compares by its value (accel's str enums against the reference's strings).
    return default.value if isinstance(default, Enum) else default


_ABSENT = object()


@dataclass
class DefaultsReport:
    compared: int = 0
    differing: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (reference's, accel's)
    unexplained: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # listed, but accel's default is the reference's now
    unknown: list[str] = field(default_factory=list)  # listed, but not a reference default


def compare_defaults() -> DefaultsReport:
    """Each literal default of the reference against accel's (where accel has the argument)."""
    reference = json.loads(REFERENCE_FILE.read_text())["defaults"]
    listed = {name for group in allowlist().get("defaults") or [] for name in group["names"]}
    report = DefaultsReport(unknown=sorted(listed - set(reference)))
    for key, expected in reference.items():
        actual = _default_of(key)
        if actual is _ABSENT:
            continue
        report.compared += 1
        # 2 and 2.0 are the same default; True and 1 are not.
        same = (
            actual is not inspect.Parameter.empty
            and isinstance(actual, bool) == isinstance(expected, bool)
            and (actual is None) == (expected is None)
            and actual == expected
        )
        if same and key in listed:
            report.stale.append(key)
        elif not same:
            report.differing[key] = (expected, actual)
            if key not in listed:
                report.unexplained.append(key)
    return report
