"""Per-step cost of the stall report's progress watch, against raw DDP in the same run.

Run: uv run python bench/stall_watch_overhead.py [--steps 300] [--repeats 7]
Re-launches itself under torchrun with 2 CPU processes (gloo). What the watch adds to a training step: one attribute
increment in ``accelerator.backward`` (the progress mark) and a daemon thread that polls the job's store (one round
trip per poll, and its probe socket blocked in ``accept``). The thread runs here at its most frequent poll, every
0.5 s (a threshold of 2 s; the default of 60 s polls every 5 s).

Four loops on the same model and batches, interleaved repeat by repeat so machine noise hits all alike:
raw DDP with no watch running, raw DDP with the watch thread running (what the thread costs a step that never
touches accel), and accel's step (``accumulate`` + ``backward``, which bumps the mark) without and with it.
Prints the median of each and the ratios; the mark's increment alone is timed with timeit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import timeit


def worker(steps: int, repeats: int) -> None:
    import torch.distributed as dist
    from step_overhead import step_loops  # the same model, batches and loops as bench/step_overhead.py

    from accel import Accelerator
    from accel_core.stall_report import POSITION, StallWatch

    accelerator = Accelerator()  # joins the gloo group; its own watch is off (ACCEL_STALL_REPORT_AFTER=0 below)
    rank = dist.get_rank()

    _, raw_loop, accel_loop = step_loops(accelerator, steps)

    def watching(loop) -> float:
        # polls every 0.5 s; the job's store named by the Accelerator's settled record
        watch = StallWatch(rank, dist.get_world_size(), 2.0, None, accelerator.state.settings.environ)
        watch.start()
        time.sleep(0.6)  # connected to the store and registered before timing
        try:
            return loop()
        finally:
            watch.stop()

    raw_loop(), accel_loop()  # warm-up
    bare, raw_watched, accel_bare, accel_watched = [], [], [], []
    for _ in range(repeats):
        bare.append(raw_loop())
        raw_watched.append(watching(raw_loop))
        accel_bare.append(accel_loop())
        accel_watched.append(watching(accel_loop))
    mark_ns = min(timeit.repeat("POSITION.step += 1", globals={"POSITION": POSITION}, number=100_000, repeat=5)) * 1e4
    if rank == 0:
        bare_ms, raw_ms, plain_ms, accel_ms = (
            statistics.median(t) * 1e3 for t in (bare, raw_watched, accel_bare, accel_watched)
        )
        print(
            f"2 processes (gloo, CPU), {steps} steps x {repeats} repeats, watch polling every 0.5 s:\n"
            f"raw DDP, no watch:        {bare_ms:.3f} ms/step\n"
            f"raw DDP, watch running:   {raw_ms:.3f} ms/step | ratio {raw_ms / bare_ms:.3f} (the thread's cost)\n"
            f"accel, no watch:          {plain_ms:.3f} ms/step | ratio accel/raw DDP {plain_ms / bare_ms:.3f}\n"
            f"accel, watch running:     {accel_ms:.3f} ms/step | ratio accel/raw DDP {accel_ms / bare_ms:.3f}, "
            f"{accel_ms / plain_ms:.3f} of accel without the watch\n"
            f"progress mark (POSITION.step += 1): {mark_ns:.0f} ns per step"
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args.steps, args.repeats)
        return
    env = {**os.environ, "ACCEL_USE_CPU": "true", "OMP_NUM_THREADS": "1", "ACCEL_STALL_REPORT_AFTER": "0"}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", __file__]
    subprocess.run([*command, f"--steps={args.steps}", f"--repeats={args.repeats}"], env=env, check=True)


if __name__ == "__main__":
    main()
