"""ZeRO-3 training step: accel against DeepSpeed used directly, in one launch.

Run: uv run torchrun --nproc_per_node 2 bench/zero3_step.py [--rounds 10] [--steps 10] [--operators]

The model, batch and loop are bench/compare's ZeRO-3 scenario (4 residual MLP blocks of width 256, AdamW,
accumulation 2, clipping at 1.0): accel's ``Accelerator`` with ``DeepSpeedPlugin(zero_stage=3)`` against
``deepspeed.initialize`` with the config a user writes by hand (bench/compare's raw harness) and DeepSpeed's own
loop, ``engine.backward(loss)`` + ``engine.step()``. The two engines' configs are compared first (accel's once its
"auto" values are filled): the comparison is only fair if they are the same. Both engines live in the same
processes; rounds alternate (the order flips each round), so machine load hits both alike. At the end each
process compares the two engines' parameter partitions: identical bit for bit, or the script says by how much not.

Printed, per optimizer step (2 micro-steps):
- the collectives each issues (counted at ``deepspeed.comm``'s backend, through which DeepSpeed issues all of its,
  plus any ``torch.distributed`` collective called outside it), and bytes;
- the Python function calls (cProfile) and aten operators (the profiler): the work done, which
  load does not change;
- wall time and the process CPU time (all threads), median and range over the rounds; accel / raw as the ratio
  of the medians and as the median of the per-round ratios (each round's two figures are taken back to back).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import threading
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "compare"), os.path.join(HERE, "compare", "scenarios")]

_DS_COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "inference_all_reduce",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_base",
    "all_gather_coalesced",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "all_to_all_single",
    "barrier",
)
_TORCH_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
)


def _bytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def count_collectives() -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Wraps the collectives of ``deepspeed.comm``'s backend (DeepSpeed caches torch's functions in it at start, so
    wrapping ``torch.distributed`` would miss them) and those of ``torch.distributed`` called outside it (accel's
    own, if any: named ``torch.<name>``); returns (calls, bytes of the largest tensor argument) counters."""
    import deepspeed.comm.comm as ds_comm
    import torch.distributed as dist

    calls: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    inside = threading.local()

    def wrap(owner: Any, name: str, label: str, outer: bool) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def counted(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            depth = getattr(inside, "depth", 0)
            if outer or depth == 0:  # a torch call made by the backend is the backend's call, counted once
                calls[label] += 1
                sizes[label] += max([_bytes(a) for a in (*args, *kwargs.values())] or [0])
            inside.depth = depth + (1 if outer else 0)
            try:
                return _original(*args, **kwargs)
            finally:
                inside.depth = depth

        setattr(owner, name, functools.wraps(original)(counted))

    backend = ds_comm.cdb
    assert backend is not None, "deepspeed.comm is not initialized yet: count after the engines are built"
    for name in _DS_COLLECTIVES:
        wrap(backend, name, name, outer=True)
    for name in _TORCH_COLLECTIVES:
        wrap(dist, name, f"torch.{name}", outer=False)
    return calls, sizes


def compare_configs(accel: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between the two engines' configs."""

    def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in config.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[prefix + key] = value
        return out

    a, r = flat(accel), flat(raw)
    return [
        f"{k}: accel {a.get(k, '(absent)')!r}, raw {r.get(k, '(absent)')!r}"
        for k in sorted(set(a) | set(r))
        if a.get(k) != r.get(k)
    ]


def paired(figures: dict[str, list[float]]) -> str:
    """The median and range of the per-round ratios accel / raw."""
    ratios = sorted(a / r for a, r in zip(figures["accel"], figures["raw"], strict=True))
    return f"{statistics.median(ratios):.3f} ({ratios[0]:.3f} to {ratios[-1]:.3f})"


def main(argv: list[str] | None = None) -> None:
    """The benchmark; ``argv``: its options (the command line's by default), so that a test can run it inside a launch
    of its own (tests/bench/zero3_step_checks.py)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--steps", type=int, default=10, help="micro-steps per timed round (even: whole optimizer steps)"
    )
    parser.add_argument("--dim", type=int, default=256, help="block width (the benchmark's: 256)")
    parser.add_argument("--depth", type=int, default=4, help="blocks (the benchmark's: 4)")
    parser.add_argument(
        "--operators", action="store_true", help="also print each aten operator whose count differs (accel vs raw)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    from types import SimpleNamespace

    from frameworks import AccelHarness, RawHarness  # pyright: ignore[reportMissingImports] - bench/compare on sys.path
    from sharded import Block  # pyright: ignore[reportMissingImports]
    from step_pair import alternate_rounds, count_work, print_times

    dim, depth = args.dim, args.depth

    def build() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(*[Block(dim) for _ in range(depth)])
        model.config = SimpleNamespace(hidden_size=dim)  # what ZeRO-3's "auto" bucket sizes are derived from
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    loops = {}
    for harness in (AccelHarness(grad_accum=2, strategy="zero3"), RawHarness(grad_accum=2, strategy="zero3")):
        model, optimizer, _ = harness.prepare(*build())
        loops[harness.name] = (harness, model, optimizer)
    rank = dist.get_rank()
    differences = compare_configs(loops["accel"][1].config, loops["raw"][1].config)
    if rank == 0:
        print("configs: identical" if not differences else "configs differ:\n  " + "\n  ".join(differences))
    calls, sizes = count_collectives()
    torch.manual_seed(rank)
    x, y = torch.randn(32, dim), torch.randn(32, dim)

    def step(name: str, micro: int) -> None:
        harness, model, optimizer = loops[name]
        for _ in range(micro):
            harness.train_step(model, optimizer, None, x, y)

    for name in loops:
        step(name, 4)  # warm-up: two optimizer steps

    count_work(list(loops), step, calls, sizes, args.operators, mb_digits=2)
    wall, cpu = alternate_rounds(list(loops), step, args.rounds, args.steps)

    # Same seed, same batches, same number of micro-steps: the partitions must match bit for bit.
    pairs = zip(loops["accel"][1].module.parameters(), loops["raw"][1].module.parameters(), strict=True)
    worst = max(float((a.ds_tensor - r.ds_tensor).abs().max()) for a, r in pairs)
    worst_all = torch.tensor(worst)
    dist.all_reduce(worst_all, op=dist.ReduceOp.MAX)
    if rank == 0:
        print_times(wall, cpu, args.rounds, args.steps)
        # Each round's two figures were taken back to back: their ratio is steadier under a changing load than the
        # ratio of the two medians (on the loaded 2-core machine single rounds range over 2-3x).
        print(f"accel / raw per round: wall {paired(wall)}, CPU {paired(cpu)}")
        micro = 4 + 3 * 2 + args.rounds * args.steps
        verdict = "identical" if worst_all.item() == 0 else f"differ (max abs difference {worst_all.item():.3g})"
        print(f"parameters after {micro} micro-steps: {verdict}")


if __name__ == "__main__":
    main()
