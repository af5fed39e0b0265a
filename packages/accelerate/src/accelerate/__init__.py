"""accelerate, answered by accel: the opt-in shim distribution (``pip install`` its wheel to turn it on, reinstall
Hugging Face's ``accelerate`` to turn it off; docs/frameworks.md).

``accelerate.__version__`` is the Accelerate API level accel matches (the frameworks compare it); every top-level
name is accel's (``accelerate.Accelerator is accel.Accelerator``), and ``import accelerate.<path>`` gives the module
``accel.<path>`` itself. ``import accelerate`` imports neither torch nor accel's modules: they load on first use.
"""

from __future__ import annotations

from typing import Any

import accel as _accel

from ._aliasing import install as _install

# The Accelerate release whose API accel's modules answer for (the distribution's version adds "+accel.<accel's>").
__version__ = "1.15.0"
ACCEL_VERSION = _accel.__version__

_install("accelerate", "accel")

__all__ = list(_accel.__all__)


def __getattr__(name: str) -> Any:
    try:
        return getattr(_accel, name)
    except AttributeError:
        raise AttributeError(f"module 'accelerate' (accel {ACCEL_VERSION}) has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
