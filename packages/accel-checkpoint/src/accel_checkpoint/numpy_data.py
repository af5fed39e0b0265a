"""Numpy arrays count as data when loading: ``torch.load(weights_only=True)`` may rebuild them.

Accelerate's checkpoints (``random_states_<rank>.pkl``) and many users' files hold numpy arrays,
and Accelerate loads them under ``weights_only=True`` by allow-listing numpy's array rebuilders.
accel does the same, so the answer to "may this file load?" does not depend on what else the
process imported: megatron-core, for one, allow-lists these globals for the whole process at import.

torch's own ``safe_globals`` context is not used because its exit removes the globals even when
another library had registered them before (megatron-core's own loads would then fail), and two
overlapping blocks in threads would take them away from each other. ``numpy_arrays_allowed`` adds
only what is missing and removes it when the last block that needed it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_open_blocks = 0
_added_by_us: list[Any] = []


def numpy_data_globals() -> list[Any]:
    """The globals a pickled plain numpy array (and numpy's RNG state) needs: rebuilders and dtypes, no code."""
    import codecs

    import numpy as np

    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core to np._core
    allowed: list[Any] = [core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]  # pyright: ignore[reportAttributeAccessIssue]
    # Each dtype's own class (np.dtypes.Int64DType on numpy >= 1.25, the unnamed numpy.dtype[int64] before):
    # unpickling a dtype rebuilds an instance of it.
    allowed += [type(np.dtype(name)) for name in ("uint32", "float64", "int64", "float32")]
    return allowed


@contextmanager
def numpy_arrays_allowed() -> Iterator[None]:
    """Within the block, ``torch.load(weights_only=True)`` accepts numpy arrays; other registrations are untouched."""
    import torch

    global _open_blocks
    with _lock:
        if _open_blocks == 0:
            present = set(map(id, torch.serialization.get_safe_globals()))
            _added_by_us[:] = [g for g in numpy_data_globals() if id(g) not in present]
            torch.serialization.add_safe_globals(_added_by_us)
        _open_blocks += 1
    try:
        yield
    finally:
        with _lock:
            _open_blocks -= 1
            if _open_blocks == 0 and _added_by_us:
                # torch keeps the list as a set: take back exactly what this module added.
                remaining = [g for g in torch.serialization.get_safe_globals() if all(g is not a for a in _added_by_us)]
                torch.serialization.clear_safe_globals()
                torch.serialization.add_safe_globals(remaining)
                _added_by_us.clear()
