"""Seeding and RNG synchronisation across processes.

``set_seed`` seeds python, numpy and torch itself; a backend whose devices draw from a generator of their own
(torch-xla's) adds a *seeder*: a function of the seed, registered under the ``accel.seeders`` entry point (found
on the first ``set_seed``, so a script may seed before it creates its ``Accelerator``) or with
``register_seeder``. Core names no backend here.
"""

from __future__ import annotations

import random as _random
from collections.abc import Iterable
from typing import Protocol

import torch

from .state import PartialState

SEEDERS_GROUP = "accel.seeders"


class Seeder(Protocol):
    """Seeds one more random number generator with ``set_seed``'s seed (already offset by the process index when
    ``device_specific``). Called in every process that calls ``set_seed``; it must do nothing where its backend's
    library is not installed, and import that library only when it is."""

    def __call__(self, seed: int) -> None: ...


_seeders: list[Seeder] = []
_entry_points_loaded = False


def register_seeder(seeder: Seeder) -> None:
    """Adds ``seeder`` to those ``set_seed`` calls (once, however often it is registered)."""
    if seeder not in _seeders:
        _seeders.append(seeder)


def seeders() -> list[Seeder]:
    """The registered seeders, the installed ``accel.seeders`` entry points first (loaded on the first call)."""
    global _entry_points_loaded
    if not _entry_points_loaded:
        from . import discovery

        for name in discovery.available(SEEDERS_GROUP):
            register_seeder(discovery.load(SEEDERS_GROUP, name))
        _entry_points_loaded = True
    return list(_seeders)


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seeds python, numpy and torch (all devices), and every registered seeder's generator (XLA's where
    accel-xla and torch-xla are installed).

    device_specific: add the process index, so each process draws different numbers.
    deterministic: also ask torch for deterministic algorithms (slower; may raise on some ops).
    """
    if device_specific:
        seed += PartialState().process_index
    _random.seed(seed)
    try:  # numpy is optional for accel-core
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds CUDA/XPU generators too
    for seeder in seeders():
        seeder(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def get_rng_state(rng_type: str, generator: torch.Generator | None = None) -> torch.Tensor | None:
    """The state of one RNG (``torch``, ``cuda``, ``xpu`` or ``generator``); None where it does not
    exist here (no such device, no generator, or ``xla``, whose strategy handles it)."""
    if rng_type == "torch":
        return torch.get_rng_state()
    if rng_type == "cuda":
        return torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    if rng_type == "xpu":
        return torch.xpu.get_rng_state() if hasattr(torch, "xpu") and torch.xpu.is_available() else None
    if rng_type == "generator":
        return generator.get_state() if generator is not None else None
    if rng_type == "xla":
        return None
    raise ValueError(f"Unknown rng type {rng_type!r}: use 'torch', 'cuda', 'xpu', 'xla' or 'generator'.")


def set_rng_state(rng_type: str, state: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """Restores what ``get_rng_state`` returned."""
    if rng_type == "torch":
        torch.set_rng_state(state)
    elif rng_type == "cuda":
        torch.cuda.set_rng_state(state)
    elif rng_type == "xpu":
        torch.xpu.set_rng_state(state)
    elif rng_type == "generator" and generator is not None:
        generator.set_state(state)


def synchronize_rng_state(rng_type: str, generator: torch.Generator | None = None) -> None:
    """Copies process 0's state of one RNG (``torch``, ``cuda``, ``xpu`` or ``generator``) to every process."""
    state = PartialState()
    if not state.use_distributed:
        return
    if rng_type == "generator" and generator is None:
        raise ValueError("synchronize_rng_state('generator') needs the generator to synchronise.")
    rng_state = get_rng_state(rng_type, generator)
    if rng_state is None:
        return
    import torch.distributed as dist

    holder = [rng_state]
    dist.broadcast_object_list(holder, src=0)
    set_rng_state(rng_type, holder[0], generator)


def synchronize_rng_states(rng_types: Iterable[str], generator: torch.Generator | None = None) -> None:
    """``synchronize_rng_state`` for each of ``rng_types``."""
    for rng_type in rng_types:
        synchronize_rng_state(str(rng_type), generator=generator)
