"""Per-epoch synchronisation of random number generators from the group's first process.

Every process runs its own copy of the sampler, so a shuffled epoch is only sharded correctly if
every copy draws the same permutation: at the start of each epoch the prepared loader copies
process 0's generator states to the others, in a single broadcast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from accel_core.random import get_rng_state, set_rng_state

from .comm import Comm

RNG_TYPES = ("torch", "cuda", "xpu", "xla", "generator")


def normalize_rng_types(rng_types: Sequence[Any] | None, num_processes: int) -> list[str]:
    """Validated names; ``None`` means ``["generator"]`` when sharding over several processes.

    (Accelerate's standalone default is no synchronisation at all, which silently breaks a shuffled
    loader whose processes were not seeded alike.)
    """
    if rng_types is None:
        return ["generator"] if num_processes > 1 else []
    names = [str(getattr(t, "value", t)).lower() for t in rng_types]
    unknown = [n for n in names if n not in RNG_TYPES]
    if unknown:
        raise ValueError(f"Unknown rng_types {unknown}: choose from {list(RNG_TYPES)}.")
    return names


def synchronize_rng_states(
    rng_types: Sequence[str], comm: Comm | None, generator: torch.Generator | None = None, seed: int | None = None
) -> int | None:
    """Copies process 0's states of ``rng_types`` (and ``seed``, a seedable sampler's) to the group.

    Returns the synchronised seed. A no-op without a group.
    """
    if comm is None or comm.size <= 1:
        return seed
    kinds = [k for k in rng_types if get_rng_state(k, generator) is not None]
    states = [get_rng_state(k, generator) for k in kinds]
    pieces = [s.detach().to("cpu", torch.uint8).reshape(-1) for s in states if s is not None]
    with_seed = seed is not None and "generator" in rng_types
    if with_seed:
        pieces.append(torch.tensor([seed], dtype=torch.int64).view(torch.uint8))
    if not pieces:
        return seed
    buf = comm.broadcast(torch.cat(pieces)).cpu()
    offset = 0
    for kind, state in zip(kinds, states, strict=True):
        assert state is not None
        n = state.numel()
        set_rng_state(kind, buf[offset : offset + n].clone(), generator)
        offset += n
    if with_seed:
        seed = int(buf[offset : offset + 8].clone().view(torch.int64).item())
    return seed
