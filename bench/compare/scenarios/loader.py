"""Time per batch of a prepared (sharded) data loader over an epoch, and of the dispatching one where it exists."""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils.data import TensorDataset


def _per_batch_ms(loader, epochs: int) -> float:
    times = []
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        elif hasattr(getattr(loader, "sampler", None), "set_epoch"):
            loader.sampler.set_epoch(epoch)
        start, n = time.perf_counter(), 0
        for _batch in loader:
            n += 1
        times.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(times)


def run(harness, quick: bool = False, **_: str) -> dict:
    samples, epochs = (2048, 1) if quick else (16384, 2)
    generator = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(samples, 32, generator=generator), torch.randint(0, 10, (samples,)))
    result = {"sharded_ms": _per_batch_ms(harness.loader(dataset, 64, shuffle=True), epochs)}
    dispatched = harness.loader(dataset, 64, shuffle=True, dispatch=True) if harness.world > 1 else None
    if dispatched is not None:
        result["dispatch_ms"] = _per_batch_ms(dispatched, epochs)
    return result
