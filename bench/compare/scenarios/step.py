"""Per-step training time with gradient accumulation (2), gradient clipping and an LR scheduler, and the peak
resident memory of the processes that ran it."""

from __future__ import annotations

import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist


def peak_rss_mb() -> float:
    """This process's peak resident memory (MB): imports, framework setup, model, optimizer and the steps so far.

    Read from /proc's VmHWM, the high-water mark of this process's own memory map. Not ``ru_maxrss``: Linux carries
    the parent's high-water mark across fork + exec into it (a child of a 400 MB parent reports 400 MB however little
    it holds), so it would measure the launcher, not the framework.
    """
    if sys.platform.startswith("linux"):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6  # kB
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 1e6 if sys.platform == "darwin" else maxrss * 1024 / 1e6  # macOS: bytes; elsewhere kB


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
    # The scenario runs first in its launch: the peak is the framework's process for the train step (the loader and
    # gather scenarios run after it). The largest of the processes: what a node must provide per process.
    peaks = [peak_rss_mb()]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        peaks = [0.0] * dist.get_world_size()
        dist.all_gather_object(peaks, peak_rss_mb())
    return {"step_ms": statistics.median(per_step), "peak_rss_mb": max(peaks)}
