"""Per-step overhead of accel over raw torch.distributed + DDP, and the import cost of accel.

Run: uv run python bench/step_overhead.py [--steps 200] [--repeats 5]
It re-launches itself under torchrun with 2 CPU processes (gloo). Both loops train the same model
on the same in-memory batches, interleaved repeat by repeat so machine noise hits both alike.
Prints the median per-step time of each and the ratio accel/raw (goal <= 1.03), and the cost of
``skip_nonfinite=True`` (one max-norm of the gradients and one all_reduce of a flag per step) next
to the same accel loop without it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def import_times() -> None:
    def wall(code: str) -> float:
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            samples.append(time.perf_counter() - start)
        return min(samples)

    bare = wall("pass")
    torch_s = wall("import torch") - bare
    accel_s = wall("import accel") - bare
    accelerator_s = wall("from accel import Accelerator") - bare
    print(
        f"import torch: {torch_s:.3f} s | import accel: {accel_s:.3f} s ({accel_s / torch_s:.2f}x torch) | "
        f"from accel import Accelerator: {accelerator_s:.3f} s ({accelerator_s / torch_s:.2f}x torch)"
    )


def step_loops(accelerator, steps: int):
    """The timed loops, over the same model and in-memory batches: ``(make, raw_loop, accel_loop)``.

    ``make()`` builds the model and its optimizer; ``raw_loop()`` trains a DDP copy with torch alone;
    ``accel_loop(acc, model, opt)`` trains with an Accelerator (by default ``accelerator`` and a model it prepared).
    Each returns seconds per step. Shared with stall_watch_overhead.py."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    torch.manual_seed(dist.get_rank())
    batches = [(torch.randn(64, 256), torch.randn(64, 256)) for _ in range(16)]

    raw_model, raw_opt = make()
    raw_model = DistributedDataParallel(raw_model)
    acc_model, acc_opt = accelerator.prepare(*make())

    def raw_loop() -> float:
        dist.barrier()
        start = time.perf_counter()
        for i in range(steps):
            x, y = batches[i % len(batches)]
            loss = torch.nn.functional.mse_loss(raw_model(x), y)
            loss.backward()
            raw_opt.step()
            raw_opt.zero_grad()
        return (time.perf_counter() - start) / steps

    def accel_loop(acc=accelerator, model=acc_model, opt=acc_opt) -> float:
        dist.barrier()
        start = time.perf_counter()
        for i in range(steps):
            x, y = batches[i % len(batches)]
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
        return (time.perf_counter() - start) / steps

    return make, raw_loop, accel_loop


def worker(steps: int, repeats: int) -> None:
    import torch.distributed as dist

    from accel import Accelerator

    accelerator = Accelerator()  # joins the gloo group
    rank = dist.get_rank()
    make, raw_loop, accel_loop = step_loops(accelerator, steps)
    guarded = Accelerator(skip_nonfinite=True)
    guarded_model, guarded_opt = guarded.prepare(*make())

    def guarded_loop() -> float:
        return accel_loop(guarded, guarded_model, guarded_opt)

    raw_loop(), accel_loop(), guarded_loop()  # warm-up
    raw_times, accel_times, guarded_times = [], [], []
    for _ in range(repeats):
        raw_times.append(raw_loop())
        accel_times.append(accel_loop())
        guarded_times.append(guarded_loop())
    if rank == 0:
        raw_ms, accel_ms = statistics.median(raw_times) * 1e3, statistics.median(accel_times) * 1e3
        guarded_ms = statistics.median(guarded_times) * 1e3
        print(
            f"2 processes (gloo, CPU), {steps} steps x {repeats} repeats: raw DDP {raw_ms:.3f} ms/step | "
            f"accel {accel_ms:.3f} ms/step | ratio accel/raw {accel_ms / raw_ms:.3f} (goal <= 1.03)\n"
            f"skip_nonfinite=True: {guarded_ms:.3f} ms/step, {guarded_ms / accel_ms:.3f} of accel without it"
        )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if "LOCAL_RANK" in os.environ:
        worker(args.steps, args.repeats)
        return
    import_times()
    env = {**os.environ, "ACCEL_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--standalone",
            __file__,
            f"--steps={args.steps}",
            f"--repeats={args.repeats}",
        ],
        env=env,
        check=True,
    )


if __name__ == "__main__":
    main()
