"""Gathering an evaluation set's predictions and labels (gather_for_metrics; Fabric: all_gather; raw: all_gather).

The set has a size no process count divides, so the last batch is uneven: `exact_count` says whether the
gathered rows number exactly the set's samples (no padded duplicates), as metrics need.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.utils.data import TensorDataset


def run(harness, quick: bool = False, **_: str) -> dict:
    samples, rounds = (401, 1) if quick else (2001, 3)
    generator = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(samples, 32, generator=generator), torch.randint(0, 10, (samples,)))
    model = torch.nn.Linear(32, 10)
    loader = harness.loader(dataset, 16, shuffle=False)
    gather_times, counts = [], []
    for _ in range(rounds):
        spent, batches, rows = 0.0, 0, 0
        harness.barrier()
        for x, y in loader:
            with torch.no_grad():
                logits = model(x)
            start = time.perf_counter()
            logits, labels = harness.gather_eval(logits, y)
            spent += time.perf_counter() - start
            batches += 1
            rows += labels.shape[0]
        if harness.name == "raw" and harness.world > 1:
            rows = min(rows, samples)  # the hand-written loop drops DistributedSampler's padding itself
        gather_times.append(spent / batches * 1e3)
        counts.append(rows)
    return {
        "gather_ms": statistics.median(gather_times),
        "exact_count": all(c == samples for c in counts),
        "rows": counts[0],
        "samples": samples,
    }
