"""XLA's part of ``set_seed`` (the ``accel.seeders`` entry point): XLA devices draw from torch-xla's own seed, which
``torch.manual_seed`` leaves alone, so accel-core's ``set_seed`` calls ``seed_xla`` too, as the reference's seeds
XLA whenever torch-xla is installed. Registered as an entry point rather than by the strategy, so a script that
seeds before it creates its ``Accelerator`` seeds XLA as well. torch_xla is imported only where it is installed
(through ``require_torch_xla``, which refuses a torch and torch-xla of different releases).
"""

from __future__ import annotations

import importlib.util


def seed_xla(seed: int) -> None:
    """Seeds torch-xla's generator with ``seed``; nothing where torch-xla is not installed."""
    if importlib.util.find_spec("torch_xla") is None:
        return
    from .runtime import require_torch_xla

    require_torch_xla().xm.set_rng_state(seed)
