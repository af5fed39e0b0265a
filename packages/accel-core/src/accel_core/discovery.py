"""Discovery of what other packages add to accel, through entry points, loaded only when needed.

Groups:
- ``accel.strategies``: name -> Strategy class (``ddp``, ``fsdp``, ``deepspeed``, ...).
- ``accel.preparers``: ``dataloader`` -> an object implementing ``DataLoaderPreparer``.
- ``accel.trackers``: tracker name -> tracker class (``local``, ``tensorboard``, ``wandb``, ...).
- ``accel.checkpoint``: ``state`` -> an object implementing ``CheckpointHandler``.
- ``accel.precisions``: ``fp8`` -> a precision class for fp8 training (Transformer-Engine).
- ``accel.cli``: name -> callable adding a backend's flags to ``accel launch`` (the contract is
  accel_core.launch_options; accel_launch loads them).
- ``accel.seeders``: name -> a function of the seed that ``set_seed`` calls (XLA's own generator).
- ``accel.model_wrappers``: module name -> a class of that module that wraps the user's model in
  ``.module`` (``deepspeed`` -> ``DeepSpeedEngine``), unwrapped by ``extract_model_from_parallel``
  once the module is imported.

This module must not import torch.
"""

from __future__ import annotations

import difflib
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from .install_hints import accel_extra

# Which distribution provides which feature, for the error message when it is missing.
_PROVIDERS: dict[tuple[str, str], str] = {
    ("accel.strategies", "fsdp"): "fsdp",
    ("accel.strategies", "deepspeed"): "deepspeed",
    ("accel.strategies", "megatron"): "megatron",
    ("accel.strategies", "xla"): "xla",
    ("accel.precisions", "fp8"): "fp8",
    ("accel.preparers", "dataloader"): "data",
    ("accel.checkpoint", "state"): "checkpoint",
    ("accel.trackers", "local"): "tracking",
    ("accel.trackers", "tensorboard"): "tracking",
    ("accel.trackers", "wandb"): "tracking",
    ("accel.trackers", "mlflow"): "tracking",
    ("accel.trackers", "comet_ml"): "tracking",
}

_PACKAGE_OF_EXTRA = {
    "data": "accel-data",
    "checkpoint": "accel-checkpoint",
    "tracking": "accel-tracking",
    "fsdp": "accel-fsdp",
    "deepspeed": "accel-deepspeed",
    "megatron": "accel-megatron",
    "xla": "accel-xla",
    "fp8": "accel-fp8",
}


# Packages the `accel` meta-package always installs (the rest are extras).
_INCLUDED_IN_ACCEL = {"data", "checkpoint", "tracking"}


class MissingPackageError(ImportError):
    """A feature was asked for whose package is not installed."""


# The 0.1.0 name, from when this module was ``plugins`` (a word that now means only the user's backend
# settings objects, as in Accelerate: ``FullyShardedDataParallelPlugin``, ``DeepSpeedPlugin``).
MissingPluginError = MissingPackageError


@cache
def _group(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def available(group: str) -> list[str]:
    """Names registered in ``group`` by the installed packages."""
    return sorted(_group(group))


def known(group: str) -> list[str]:
    """Names accel's own packages provide in ``group``, installed or not (``fsdp``, ``deepspeed``, ... strategies)."""
    return sorted(name for provided_group, name in _PROVIDERS if provided_group == group)


def install_hint(group: str, name: str) -> str:
    """The pip command that brings ``name`` of ``group``."""
    extra = _PROVIDERS.get((group, name))
    if extra is None:
        close = difflib.get_close_matches(name, sorted({*known(group), *available(group)}), n=1)
        return (
            f"no package provides it (did you mean '{close[0]}')" if close else "install the package that provides it"
        )
    if extra in _INCLUDED_IN_ACCEL:
        return f"pip install {_PACKAGE_OF_EXTRA[extra]}  (included in the `accel` package)"
    return f"{accel_extra(extra)}  (or pip install {_PACKAGE_OF_EXTRA[extra]})"


_loaded: set[tuple[str, str]] = set()


@cache
def load(group: str, name: str) -> Any:
    """The object registered as ``name`` in ``group``; imports its package on first use.

    Raises ``MissingPackageError`` naming the package to install when nothing provides it.
    """
    entry = _group(group).get(name)
    if entry is None:
        known = ", ".join(available(group)) or "none installed"
        raise MissingPackageError(
            f"'{name}' ({group}) is not available: {install_hint(group, name)}. Installed: {known}."
        )
    value = entry.load()
    _loaded.add((group, name))
    return value


def is_available(group: str, name: str) -> bool:
    """Whether some installed package registers ``name`` in ``group``."""
    return name in _group(group)


def is_loaded(group: str, name: str) -> bool:
    """Whether ``load(group, name)`` already ran (without loading it now)."""
    return any(key == (group, name) for key in _loaded)


def clear_cache() -> None:
    """Forgets what was discovered (for tests that install packages at run time)."""
    _group.cache_clear()
    load.cache_clear()
    _loaded.clear()
