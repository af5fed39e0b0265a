"""RNG states of one process, in a form ``torch.load(weights_only=True)`` accepts.

Python's ``random.getstate()`` is a tuple of ints, numpy's ``get_state()`` holds an ndarray; both
would need pickled globals. They are stored as tensors / ints / floats instead, so a checkpoint's
RNG file is plain data and loads safely.
"""

from __future__ import annotations

import random
from typing import Any

import torch

_FORMAT = 1


def capture_rng_state() -> dict[str, Any]:
    """Every RNG this process draws from: python, numpy, torch CPU, and CUDA/XPU/MPS when in use."""
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "format": _FORMAT,
        "python": {
            "version": py_version,
            "state": torch.tensor(py_internal, dtype=torch.int64),
            "gauss_next": py_gauss,
        },
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np
    except ImportError:  # numpy is optional for the user's script
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    # Only devices already initialised: asking an untouched CUDA for its state would start it,
    # and a device nobody drew from has nothing to restore.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available() and getattr(xpu, "is_initialized", lambda: False)():
        state["xpu"] = xpu.get_rng_state_all()
    if torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Puts back what ``capture_rng_state`` returned (devices absent now are skipped)."""
    if state.get("format") != _FORMAT:
        raise ValueError(
            f"Unknown RNG state format {state.get('format')!r}; it was written by a newer accel-checkpoint."
        )
    python = state["python"]
    random.setstate((python["version"], tuple(int(x) for x in python["state"].tolist()), python["gauss_next"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        saved = state["numpy"]
        np.random.set_state(
            (
                saved["kind"],
                saved["keys"].numpy().astype(np.uint32),
                saved["pos"],
                saved["has_gauss"],
                saved["cached_gaussian"],
            )
        )
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:  # a different machine shape: restore at least this process's device
            torch.cuda.set_rng_state(cuda_states[min(torch.cuda.current_device(), len(cuda_states) - 1)])
    xpu = getattr(torch, "xpu", None)
    if "xpu" in state and xpu is not None and xpu.is_available() and len(state["xpu"]) == xpu.device_count():
        xpu.set_rng_state_all(state["xpu"])
    if "mps" in state and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])


def restore_legacy_rng_state(state: dict[str, Any]) -> None:
    """RNG files of the reference implementation (keys random_state, numpy_random_seed, torch_manual_seed, ...)."""
    if "random_state" in state:
        random.setstate(state["random_state"])
    if "numpy_random_seed" in state:
        import numpy as np

        np.random.set_state(state["numpy_random_seed"])
    if "torch_manual_seed" in state:
        torch.set_rng_state(state["torch_manual_seed"])
    if "torch_cuda_manual_seed" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda_manual_seed"])
