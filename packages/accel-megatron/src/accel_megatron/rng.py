"""Megatron's RNG streams on the CPU.

Megatron keeps named RNG streams in a tracker (``tensor_parallel.get_cuda_rng_tracker()``): its
layers run dropout inside tensor-parallel regions under ``tracker.fork()`` (the
``model-parallel-rng`` stream, seeded ``seed + 2718 + tp_rank`` so each TP shard drops different
elements), and everything else on the default stream, which TP peers share. Its tracker and
``model_parallel_cuda_manual_seed`` only know CUDA generators; on a CPU run the same streams are
kept as CPU generator states by ``CPURNGStatesTracker``, installed where Megatron looks for its tracker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import random as megatron_random


class CPURNGStatesTracker(megatron_random.CudaRNGStatesTracker):
    """Megatron's tracker with CPU generator states: ``fork(name)`` runs its block on stream ``name``."""

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        if name not in self.states_:
            raise KeyError(f"rng state {name} is not added")
        if self._current_state_name == name:  # nested fork of the stream already running
            yield
            return
        outer_name, outer_state = self._current_state_name, torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer_state)
            self._current_state_name = outer_name


def seed_streams(seed: int, device_type: str) -> None:
    """Seeds Megatron's named streams as ``model_parallel_cuda_manual_seed`` does (CUDA: that very function)."""
    if device_type == "cuda":
        megatron_random.model_parallel_cuda_manual_seed(seed)
        return
    tracker = CPURNGStatesTracker()
    megatron_random._CUDA_RNG_STATE_TRACKER = tracker
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # The same seeds as model_parallel_cuda_manual_seed.
    tracker.add(megatron_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(
        megatron_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + parallel_state.get_tensor_model_parallel_rank()
    )
    # Untyped getters whose inferred type admits None; with the groups built they return ranks.
    expert_rank = cast(int, parallel_state.get_expert_model_parallel_rank())
    expert_tp_rank = cast(int, parallel_state.get_expert_tensor_parallel_rank())
    expert_seed = seed + 1024 + 100 * expert_rank + expert_tp_rank
    tracker.add(megatron_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, expert_seed)


def _tracker() -> megatron_random.CudaRNGStatesTracker:
    tracker = megatron_random.get_cuda_rng_tracker()
    assert tracker is not None, "Megatron always returns a tracker (its own, or the one seed_streams installs)"
    return tracker


def tracker_states() -> dict[str, torch.Tensor]:
    return dict(_tracker().get_states())


def set_tracker_states(states: dict[str, torch.Tensor]) -> None:
    _tracker().set_states(dict(states))
