"""set_seed: python, numpy and torch draw the same numbers after the same seed, and the seeders that backends
register (``accel.seeders`` entry points or ``register_seeder``) receive the seed."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from accel_core import random as accel_random
from accel_core.random import register_seeder, seeders, set_seed


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_same_seed_same_draws_in_python_numpy_and_torch() -> None:
    set_seed(11)
    first = _draws()
    set_seed(11)
    assert _draws() == first
    set_seed(12)
    assert _draws() != first


def test_registered_seeders_receive_the_seed_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = seeders()  # the entry points, loaded now
    monkeypatch.setattr(accel_random, "_seeders", list(installed))  # this test's registrations end with it
    received: list[int] = []

    def record(seed: int) -> None:
        received.append(seed)

    register_seeder(record)
    register_seeder(record)  # a second registration changes nothing
    assert seeders() == [*installed, record]
    set_seed(5)
    set_seed(5, device_specific=True)  # + process index 0
    assert received == [5, 5]
