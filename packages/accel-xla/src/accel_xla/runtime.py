"""The one door to torch_xla: imports it with a clear error, and checks it matches the installed torch.

torch-xla is built against one torch release and its wheel does not declare it, so a mismatch
installs fine and fails deep inside the first XLA operation. Every module of accel-xla imports
torch_xla through ``require_torch_xla``.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType
from typing import NamedTuple

INSTALL_HINT = 'pip install "accel[xla]" torch==<the torch release of that torch-xla> (torch-xla 2.9.0: torch 2.9.0)'


class TorchXla(NamedTuple):
    """torch_xla's modules accel-xla uses (typed loosely: torch_xla ships no stubs for pyright here)."""

    torch_xla: ModuleType
    xm: ModuleType  # torch_xla.core.xla_model
    xr: ModuleType  # torch_xla.runtime
    pl: ModuleType  # torch_xla.distributed.parallel_loader


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"2.9.0+cu128"``."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"Cannot read a release from the version {version!r}.") from None


def check_versions(torch_version: str, torch_xla_version: str) -> None:
    """Raises ImportError naming the fix unless torch and torch-xla are the same release (2.9.x with 2.9.y)."""
    if release(torch_version) != release(torch_xla_version):
        major, minor = release(torch_xla_version)
        raise ImportError(
            f"torch-xla {torch_xla_version} runs only with torch {major}.{minor}, but torch {torch_version} is "
            f"installed: pip install torch=={major}.{minor}.* (or the torch-xla release of your torch)."
        )


def require_torch_xla() -> TorchXla:
    """torch_xla's modules, or ImportError with the install command.

    Example::

        xla = require_torch_xla()
        device = xla.torch_xla.device()
    """
    import torch

    try:
        installed = metadata.version("torch-xla")
    except metadata.PackageNotFoundError:
        installed = None
    if installed is not None:  # checked before the import: a mismatched torch_xla fails while loading its library
        check_versions(torch.__version__, installed)
    try:
        torch_xla = importlib.import_module("torch_xla")
    except ModuleNotFoundError as error:
        if error.name not in ("torch_xla", None):
            raise
        raise ImportError(f"The xla strategy needs torch-xla, which is not installed: {INSTALL_HINT}.") from None
    return TorchXla(
        torch_xla=torch_xla,
        xm=importlib.import_module("torch_xla.core.xla_model"),
        xr=importlib.import_module("torch_xla.runtime"),
        pl=importlib.import_module("torch_xla.distributed.parallel_loader"),
    )
