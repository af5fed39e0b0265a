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
from functools import cache
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
REFERENCE_FILE = HERE / "reference_surface.json"
ALLOWLIST_FILE = HERE / "surface_allowlist.yaml"


def reference_names() -> list[str]:
    data = json.loads(REFERENCE_FILE.read_text())
    return [name for section, names in data.items() if section != "reference" for name in names]


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
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[: i + 1]))
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
    unexplained: list[str] = field(default_factory=list)  # missing and not in the allow-list
    stale: list[str] = field(default_factory=list)  # in the allow-list but provided
    unknown: list[str] = field(default_factory=list)  # in the allow-list but not a reference name


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
        else:
            report.unexplained.append(name)
    return report
