"""Pipeline parallelism: parameter bytes per rank, and the pipeline bubble against the number of micro-batches.

On 2 processes (``pp_size=2``), a small transformer (embedding, a stack of blocks, norm, head) is
prepared with ``ParallelismConfig(pp_size=2)``; each rank counts its stage's parameter bytes,
against the whole model's. Then the step time of ``accelerator.forward_backward`` + optimizer step
on one batch with 1, 4 and 8 micro-batches (GPipe and 1F1B), against the same model's step on one
process over the same batch (measured here on rank 0, while the other rank waits). With one
micro-batch the stages run one after the other (the whole bubble); more micro-batches overlap them.

    ACCEL_USE_CPU=true OMP_NUM_THREADS=1 uv run python -m torch.distributed.run --nproc_per_node 2 \
        bench/pipeline_bench.py [--dim 128 --depth 8 --batch 16 --steps 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "pipeline"))
from pipemodel import SEQ, lm_loss, make_model, token_data

from accel import Accelerator, ParallelismConfig
from accel_core.pipelining import parameter_bytes


def whole_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def timed_steps(step, steps: int) -> float:
    step()  # warm-up (the schedule learns shapes on its first step)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    data = token_data(args.batch)
    inputs, targets = data[:, :SEQ], data[:, 1:]

    results: dict[str, float] = {}
    share = 0.0
    for schedule in ("gpipe", "1f1b"):
        for microbatches in (1, 4, 8):
            if schedule == "1f1b" and microbatches < 2:
                continue  # 1F1B needs at least as many micro-batches as stages
            config = ParallelismConfig(pp_size=2, pp_schedule=schedule, pp_microbatches=microbatches)
            accelerator = Accelerator(parallelism_config=config)
            model = make_model(0, args.depth, args.dim)
            total = whole_bytes(model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model, optimizer = accelerator.prepare(model, optimizer)
            local = torch.tensor([float(parameter_bytes(model.stage_modules))])
            dist.all_reduce(local, op=dist.ReduceOp.MAX)
            share = local.item() / total

            def step(accelerator=accelerator, model=model, optimizer=optimizer) -> None:
                accelerator.forward_backward(model, inputs, targets, lm_loss)
                optimizer.step()
                optimizer.zero_grad()

            results[f"{schedule} x{microbatches}"] = timed_steps(step, args.steps)
            accelerator.free_memory()

    reference = make_model(0, args.depth, args.dim)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-4)

    def reference_step() -> None:
        if dist.get_rank() == 0:
            lm_loss(reference(inputs), targets).backward()
            ref_optimizer.step()
            ref_optimizer.zero_grad()

    one_process = timed_steps(reference_step, args.steps)
    if dist.get_rank() == 0:
        print(f"model dim={args.dim} depth={args.depth}, batch {args.batch} x {SEQ} tokens, 2 processes (pp=2)")
        print(f"parameter bytes per rank (max) / whole model: {share:.3f}")
        print(f"one process, whole model: {one_process * 1e3:.1f} ms/step")
        for name, seconds in results.items():
            print(
                f"pp=2 {name:>9} micro-batches: {seconds * 1e3:7.1f} ms/step "
                f"({seconds / one_process:.2f} of one process)"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
