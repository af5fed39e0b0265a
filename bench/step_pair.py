"""What bench/fsdp2_step.py and bench/zero3_step.py share: accel's loop and a hand-written one of the same model,
in the same processes, measured alike.

``count_work`` prints, per optimizer step (2 micro-steps), each loop's collectives (from the counters the script's
own wrapper fills: the two backends issue their collectives through different layers), aten operators and Python
calls; ``alternate_rounds`` times the loops in rounds whose order flips each round, so that machine load hits
both alike; ``print_times`` prints the medians and the accel / raw ratio.
"""

from __future__ import annotations

import collections
import cProfile
import os
import pstats
import statistics
import time
from collections.abc import Callable, Sequence

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

Step = Callable[[str, int], None]  # step(loop name, micro-steps)


def count_work(
    names: Sequence[str],
    step: Step,
    calls: collections.Counter[str],
    sizes: collections.Counter[str],
    operators: bool,
    mb_digits: int = 1,
) -> None:
    """Counts each loop's collectives, aten operators and Python calls over one optimizer step (rank 0 prints);
    with ``operators``, also each aten operator whose count differs between accel and raw."""
    rank = dist.get_rank()
    per_operator: dict[str, collections.Counter[str]] = {}
    for name in names:
        calls.clear()
        sizes.clear()
        step(name, 2)
        counted = ", ".join(f"{k} {v} ({sizes[k] / 1e6:.{mb_digits}f} MB)" for k, v in sorted(calls.items()))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(name, 2)
        per_operator[name] = collections.Counter(
            {e.key: e.count for e in prof.key_averages() if e.key.startswith("aten::")}
        )
        total = sum(per_operator[name].values())
        profiler = cProfile.Profile()
        profiler.enable()
        step(name, 2)
        profiler.disable()
        python_calls = pstats.Stats(profiler).total_calls  # pyright: ignore[reportAttributeAccessIssue]
        if rank == 0:
            print(f"{name:6s} per optimizer step: {counted}; aten ops {total}; Python calls {python_calls}")
    if operators and rank == 0:
        accel, raw = per_operator["accel"], per_operator["raw"]
        for op in sorted(set(accel) | set(raw), key=lambda k: accel[k] - raw[k]):
            if accel[op] != raw[op]:
                print(f"  {op:40s} accel {accel[op]:5d}  raw {raw[op]:5d}  ({accel[op] - raw[op]:+d})")


def alternate_rounds(
    names: Sequence[str], step: Step, rounds: int, steps: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per round and loop, the wall and process CPU milliseconds per micro-step; the order flips each round."""
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in list(names) if round_ % 2 == 0 else list(reversed(names)):
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            step(name, steps)
            wall[name].append((time.perf_counter() - start) / steps * 1e3)
            cpu[name].append((time.process_time() - start_cpu) / steps * 1e3)
    return wall, cpu


def print_times(wall: dict[str, list[float]], cpu: dict[str, list[float]], rounds: int, steps: int) -> None:
    """Each loop's median and range per micro-step, then accel / raw as the ratio of the medians."""
    for name in wall:
        w, c = wall[name], cpu[name]
        print(
            f"{name:6s} micro-step: wall {statistics.median(w):7.2f} ms ({min(w):.2f} to {max(w):.2f}), "
            f"CPU {statistics.median(c):7.2f} ms ({min(c):.2f} to {max(c):.2f})"
        )
    print(
        f"accel / raw: wall {statistics.median(wall['accel']) / statistics.median(wall['raw']):.3f}, "
        f"CPU {statistics.median(cpu['accel']) / statistics.median(cpu['raw']):.3f} "
        f"({rounds} alternating rounds of {steps} micro-steps, load average {os.getloadavg()[0]:.1f})"
    )
