"""Module-level lazy exports: a package names what it exports and where, and imports it on first use.

This keeps ``import accel`` and the command line free of torch. No torch import here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from .install_hints import accel_extra


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Returns ``(__getattr__, __dir__)`` for the module whose ``globals()`` is ``namespace``.

    exports: public name -> module defining it; a module starting with "." is relative to the package.
        A submodule exported under its own name (``"utils": ".utils"``) resolves to the submodule.

    Example::

        __getattr__, __dir__ = lazy_exports(globals(), {"Accelerator": ".accelerator"})
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            imported = importlib.import_module(module, package if module.startswith(".") else None)
        except ModuleNotFoundError as error:
            provider = module.split(".")[0]
            if module.startswith(".") or error.name != provider or not provider.startswith("accel_"):
                raise
            distribution, extra = provider.replace("_", "-"), provider[len("accel_") :]
            raise ImportError(
                f"{name} comes from {distribution}, which is not installed: {accel_extra(extra)} (or "
                f"pip install {distribution})."
            ) from None
        # A submodule exported under its own name ("utils": ".utils") is the module itself.
        value = imported if imported.__name__ == f"{package}.{name}" else getattr(imported, name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
