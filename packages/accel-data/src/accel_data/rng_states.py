"""This process's CPU RNG states (python, numpy, torch), captured, restored and saved as plain tensors.

A sampler without a generator draws its pass's order from the global RNGs at its first item: the shard keeps
the states it drew from (``BatchSamplerShard._started``, the loader's ``sampler_draw``), and a resumed pass
draws again from them, then puts the checkpoint's states back.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

RawStates = tuple[Any, torch.Tensor, Any]  # python's getstate(), torch's CPU state, numpy's get_state() or None


def capture() -> RawStates:
    """This process's CPU RNG states (~60 us, numpy's get_state most of it: once per pass, never per batch)."""
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
