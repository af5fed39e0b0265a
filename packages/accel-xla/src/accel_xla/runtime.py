"""The one door to torch_xla: imports it with a clear error, and checks it matches the installed torch.

torch-xla is built against one torch release and its wheel does not declare it, so a mismatch
installs fine and fails deep inside the first XLA operation (``accel_xla.versions``). Every module of
accel-xla imports torch_xla through ``require_torch_xla``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import NamedTuple

from accel_core.install_hints import accel_extra

from .versions import check_versions, install_command, installed_version

# `accel[xla]` pins the pair it is tested with (accel-xla's `xla` extra).
INSTALL_HINT = accel_extra("xla")


class TorchXla(NamedTuple):
    """torch_xla's modules accel-xla uses (typed loosely: torch_xla ships no stubs for pyright here)."""

    torch_xla: ModuleType
    xm: ModuleType  # torch_xla.core.xla_model
    xr: ModuleType  # torch_xla.runtime
    pl: ModuleType  # torch_xla.distributed.parallel_loader


def require_torch_xla() -> TorchXla:
    """torch_xla's modules, or ImportError with the install command.

    Example::

        xla = require_torch_xla()
        device = xla.torch_xla.device()
    """
    import torch

    installed = installed_version("torch-xla")
    if installed is not None:  # checked before the import: a mismatched torch_xla fails while loading its library
        check_versions(torch.__version__, installed)
    try:
        torch_xla = importlib.import_module("torch_xla")
    except ModuleNotFoundError as error:
        if error.name not in ("torch_xla", None):
            raise
        raise ImportError(
            f"The xla strategy needs torch-xla, which is not installed: {INSTALL_HINT} (that is {install_command()})."
        ) from None
    return TorchXla(
        torch_xla=torch_xla,
        xm=importlib.import_module("torch_xla.core.xla_model"),
        xr=importlib.import_module("torch_xla.runtime"),
        pl=importlib.import_module("torch_xla.distributed.parallel_loader"),
    )
