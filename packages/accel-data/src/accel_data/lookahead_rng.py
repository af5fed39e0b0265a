"""The RNG states before the loader's look-ahead read: what makes a resume exact with a random collate.

The prepared loader reads one batch ahead (to know whether the current one is the last). Without
worker processes, that read runs the dataset's transforms and the collate function in this process,
drawing from the global RNGs (python, numpy, torch) *before* the step on the current batch draws its
own (dropout). A checkpoint taken in the step holds the RNG states after both; a resumed loader reads
that batch again, from there, and every later draw shifts by one batch. So the loader keeps the states
from just before each look-ahead read; a resumed loader reads the batch again from them, then puts
back the checkpoint's states for everything after.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

RawStates = tuple[Any, torch.Tensor, Any]  # python's getstate(), torch's CPU state, numpy's get_state() or None


def capture() -> RawStates:
    """This process's CPU RNG states, as cheaply as they come (a few microseconds: once per batch)."""
    numpy = sys.modules.get("numpy")  # a script that never imported numpy draws nothing from it
    return random.getstate(), torch.get_rng_state(), numpy.random.get_state() if numpy is not None else None


def restore(states: RawStates) -> None:
    python, torch_state, numpy_state = states
    random.setstate(python)
    torch.set_rng_state(torch_state)
    if numpy_state is not None:
        import numpy as np

        np.random.set_state(numpy_state)


def to_plain(states: RawStates) -> dict[str, Any]:
    """``states`` as tensors, ints and floats only (a checkpoint loads with ``weights_only=True``)."""
    (version, internal, gauss), torch_state, numpy_state = states
    plain: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss_next": gauss},
        "torch": torch_state,
    }
    if numpy_state is not None:
        kind, keys, pos, has_gauss, cached = numpy_state
        plain["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return plain


def from_plain(plain: dict[str, Any]) -> RawStates:
    python = plain["python"]
    numpy_state = None
    if "numpy" in plain:
        import numpy as np

        saved = plain["numpy"]
        keys = saved["keys"].numpy().astype(np.uint32)
        numpy_state = (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
    internal = tuple(int(x) for x in python["state"].tolist())
    return (python["version"], internal, python["gauss_next"]), plain["torch"], numpy_state
