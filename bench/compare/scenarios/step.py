"""Per-step training time with gradient accumulation (2), gradient clipping and an LR scheduler."""

from __future__ import annotations

import statistics
import time

import torch


def run(harness, quick: bool = False, **_: str) -> dict:
    steps, rounds = (40, 1) if quick else (100, 3)  # the full run repeats launches: 5 x 3 rounds
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.001 * s))
    model, optimizer, scheduler = harness.prepare(model, optimizer, scheduler)
    torch.manual_seed(harness.rank)
    batches = [(torch.randn(64, 256), torch.randn(64, 256)) for _ in range(16)]
    for i in range(10):  # warm-up
        harness.train_step(model, optimizer, scheduler, *batches[i % 16])
    per_step = []
    for _ in range(rounds):
        harness.barrier()
        start = time.perf_counter()
        for i in range(steps):
            harness.train_step(model, optimizer, scheduler, *batches[i % 16])
        per_step.append((time.perf_counter() - start) / steps * 1e3)
    return {"step_ms": statistics.median(per_step)}
