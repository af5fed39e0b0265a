"""FSDP2 training step: accel against the same model sharded by hand with ``fully_shard``, in one launch.

Run: uv run torchrun --nproc_per_node 2 bench/fsdp2_step.py [--rounds 10] [--steps 10]

The model, batch and loop are bench/compare's FSDP2 scenario (4 residual MLP blocks of width 256,
AdamW, accumulation 2, clipping at 1.0): accel's ``Accelerator`` with
``FullyShardedDataParallelPlugin(fsdp_version=2)`` against raw ``fully_shard`` on each block and
the root. Both models live in the same processes; rounds alternate (the order flips each round),
so machine load hits both alike.

Printed, per optimizer step (2 micro-steps):
- the collectives each issues (counted by wrapping ``torch.distributed``'s functions), and bytes;
- the Python function calls (cProfile) and aten operators (the profiler): the work done, which
  load does not change;
- wall time and the process CPU time (all threads), median and range over the rounds.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "compare"), os.path.join(HERE, "compare", "scenarios")]

_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce", "broadcast", "all_gather", "barrier")


def count_collectives() -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Wraps torch.distributed's collectives (FSDP2 looks them up on the module at each call); returns
    (calls, bytes of the largest tensor argument) counters. DTensor's functional collectives (the
    all-reduce inside torch's ``clip_grad_norm_`` of DTensor gradients, raw's loop) are not seen here."""
    import torch
    import torch.distributed as dist

    calls: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for name in _COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue

        def counted(*args: Any, _name: str = name, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            calls[_name] += 1
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if tensors:  # the larger of input and output: the unsharded side
                sizes[_name] += max(t.numel() * t.element_size() for t in tensors)
            return _original(*args, **kwargs)

        setattr(dist, name, functools.wraps(original)(counted))
    return calls, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="micro-steps per timed round")
    parser.add_argument(
        "--operators", action="store_true", help="also print each aten operator whose count differs (accel vs raw)"
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    from frameworks import AccelHarness, RawHarness  # pyright: ignore[reportMissingImports] - bench/compare on sys.path
    from sharded import Block  # pyright: ignore[reportMissingImports]
    from step_pair import alternate_rounds, count_work, print_times

    calls, sizes = count_collectives()
    dim, depth = 256, 4

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(*[Block(dim) for _ in range(depth)])
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    loops = {}
    for harness in (AccelHarness(grad_accum=2, strategy="fsdp2"), RawHarness(grad_accum=2, strategy="fsdp2")):
        model, optimizer, _ = harness.prepare(*build())
        loops[harness.name] = (harness, model, optimizer)
    rank = dist.get_rank()
    torch.manual_seed(rank)
    x, y = torch.randn(32, dim), torch.randn(32, dim)

    def step(name: str, micro: int) -> None:
        harness, model, optimizer = loops[name]
        for _ in range(micro):
            harness.train_step(model, optimizer, None, x, y)

    for name in loops:
        step(name, 4)  # warm-up: two optimizer steps

    count_work(list(loops), step, calls, sizes, args.operators)
    wall, cpu = alternate_rounds(list(loops), step, args.rounds, args.steps)
    if rank == 0:
        print_times(wall, cpu, args.rounds, args.steps)


if __name__ == "__main__":
    main()
