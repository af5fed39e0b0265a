"""Version comparisons of installed libraries, as the reference's ``accelerate.utils.versions``. No torch import."""

from __future__ import annotations

import importlib.metadata
import operator
from collections.abc import Callable
from functools import cache
from typing import Any

from packaging.version import Version, parse

STR_OPERATION_TO_FUNC: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    "<": operator.lt,
}


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """Compares an installed library's version (given its distribution name) or a ``Version`` with
    ``requirement_version``.

    Example::

        compare_versions("torch", ">=", "2.4")      # the installed torch
        compare_versions(parse("1.2"), "<", "1.10")  # True
    """
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"`operation` must be one of {list(STR_OPERATION_TO_FUNC)}, received {operation!r}.")
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib.metadata.version(library_or_version))
    return STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version))


@cache
def _torch_version() -> Version:
    # Read from the installed distribution, so asking does not import torch.
    return parse(importlib.metadata.version("torch"))


def is_torch_version(operation: str, version: str) -> bool:
    """Compares the installed PyTorch with ``version``: ``is_torch_version(">=", "2.4")``."""
    return compare_versions(_torch_version(), operation, version)
