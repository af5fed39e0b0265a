"""Small helpers of the reference's ``accelerate.utils`` that are not about tensors or models.

Example::

    from accel.utils import wait_for_everyone, convert_bytes

    wait_for_everyone()              # a barrier, without an Accelerator object at hand
    print(convert_bytes(3 * 2**20))  # "3.0 MB"
"""

from __future__ import annotations

import platform
import re
import socket
import warnings
from typing import Any

from packaging.version import Version


def wait_for_everyone() -> None:
    """Blocks until every process reaches this line (a no-op on one process). Every process must call it."""
    from ..state import PartialState

    PartialState().wait_for_everyone()


def get_pretty_name(obj: Any) -> str:
    """The qualified name of a class, function or instance (its class's), else ``str(obj)``."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or str(obj)


def merge_dicts(source: dict[Any, Any], destination: dict[Any, Any]) -> dict[Any, Any]:
    """Copies ``source`` into ``destination`` recursively (nested dicts are merged, other values replaced); returns
    it."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on ``localhost:port`` (default 29500, the usual rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("localhost", 29500 if port is None else port)) == 0


def convert_bytes(size: float) -> str:
    """``size`` bytes in the largest unit below 1024: ``convert_bytes(1536) == "1.5 KB"``."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def check_os_kernel() -> None:
    """Warns on Linux kernels older than 5.5, on which distributed jobs can hang (the reference's check)."""
    info = platform.uname()
    if info.system != "Linux":
        return
    found = re.search(r"\d+\.\d+\.\d+", info.release)
    if found is not None and Version(found.group()) < Version("5.5.0"):
        warnings.warn(
            f"Detected kernel version {found.group()}, which is below the recommended minimum of 5.5.0; this can "
            "cause the process to hang. It is recommended to upgrade the kernel to the minimum version or higher.",
            stacklevel=2,
        )
