"""RNG states are captured as plain data and restore every stream exactly."""

from __future__ import annotations

import random

import numpy as np
import torch

from accel_checkpoint.rng import capture_rng_state, restore_rng_state


def _draws():
    return (
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        np.random.randn(),
        torch.rand(4).tolist(),
        torch.randn(2).tolist(),
    )


def test_restore_replays_python_numpy_and_torch(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in python's state
    np.random.randn()
    state = capture_rng_state()
    path = str(tmp_path / "random_states_0.pt")
    torch.save(state, path)
    expected = _draws()
    _draws()  # move every stream on
    restore_rng_state(torch.load(path, weights_only=True))  # plain data: the safe loader accepts it
    assert _draws() == expected
