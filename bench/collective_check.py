"""Cost of the agreement check that runs before every gather / gather_for_metrics / broadcast / reduce.

Measured side by side in one run on 2 CPU processes (gloo): an evaluation set gathered with
``gather_for_metrics`` as the reference's examples do — ``(predictions, labels)`` per batch — with
the check, the same loop with the check switched off in this process (bench only), and 0.1.0's
path (no check, one all_gather per tensor, where several tensors now travel in one). Three
payloads: class ids (a classifier: two int64 vectors per batch), a batch's logits (batch x 1000
fp32), and token logits (batch x 128 x 1000 fp32, a language model's). For each: the time of
gather_for_metrics alone, and of the whole evaluation loop (a forward of a small model + gather).
Goal: the check adds under 5% to gather_for_metrics on an evaluation set.

Usage: torchrun --nproc_per_node 2 bench/collective_check.py [--batches 200] [--repeats 5]
(ACCEL_USE_CPU=true for gloo on a machine with a GPU.)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import accel_core.accelerator as accelerator_module
from accel_core import Accelerator, ops


def without_check(fn: Callable[[], float]) -> Callable[[], float]:
    def run() -> float:
        check, small = accelerator_module.check_agreement, accelerator_module.checked_small_gather
        accelerator_module.check_agreement = lambda *args, **kwargs: None
        accelerator_module.checked_small_gather = lambda *args, **kwargs: None  # the data goes the unchecked way
        try:
            return fn()
        finally:
            accelerator_module.check_agreement, accelerator_module.checked_small_gather = check, small

    return run


def per_leaf(fn: Callable[[], float]) -> Callable[[], float]:
    """0.1.0's path: no check, one all_gather per tensor (today several tensors travel in one)."""

    def run() -> float:
        gather = accelerator_module.Accelerator.gather_for_metrics
        accelerator_module.Accelerator.gather_for_metrics = lambda self, data, use_gather_object=False: (
            ops.recursively_apply(ops._gather_one, data)
        )
        try:
            return fn()
        finally:
            accelerator_module.Accelerator.gather_for_metrics = gather

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="batches in the evaluation set (per process)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    acc = Accelerator()
    torch.manual_seed(acc.process_index)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1000))
    inputs = torch.randn(args.batch_size, 256)
    labels = torch.randint(0, 1000, (args.batch_size,))
    token_logits = torch.randn(args.batch_size, 128, 1000)

    payloads: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
        "class ids (2 x int64[32])": lambda logits: (logits.argmax(dim=-1), labels),
        "logits (fp32[32, 1000])": lambda logits: (logits, labels),
        "token logits (fp32[32, 128, 1000])": lambda logits: (token_logits, labels),
    }

    def evaluation(
        make: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], batches: int
    ) -> Callable[[], float]:
        def run() -> float:
            gathering = 0.0
            with torch.no_grad():
                for _ in range(batches):
                    outputs = make(model(inputs))
                    start = time.perf_counter()
                    acc.gather_for_metrics(outputs)
                    gathering += time.perf_counter() - start
            return gathering

        return run

    rows = []
    for name, make in payloads.items():
        batches = args.batches if "token" not in name else max(5, args.batches // 20)
        variants = {
            "checked": evaluation(make, batches),
            "unchecked": without_check(evaluation(make, batches)),
            "per_leaf": per_leaf(evaluation(make, batches)),
        }
        variants["unchecked"]()  # warm-up
        gather_s: dict[str, list[float]] = {k: [] for k in variants}
        loop_s: dict[str, list[float]] = {k: [] for k in variants}
        for repeat in range(args.repeats):
            order = list(variants) if repeat % 2 == 0 else list(reversed(variants))  # none always goes first
            for variant in order:
                acc.wait_for_everyone()
                start = time.perf_counter()
                gather_s[variant].append(variants[variant]())
                loop_s[variant].append(time.perf_counter() - start)
        g = {k: statistics.median(v) for k, v in gather_s.items()}
        loop = {k: statistics.median(v) for k, v in loop_s.items()}
        rows.append((name, batches, g, loop))

    if acc.is_main_process:
        print(f"2 processes ({acc.state.backend}), median of {args.repeats}; per gather_for_metrics call:")
        for name, batches, g, loop in rows:
            per_call = {k: v / batches * 1e6 for k, v in g.items()}
            print(
                f"{name:36s} unchecked {per_call['unchecked']:8.0f} us  checked {per_call['checked']:8.0f} us  "
                f"gather_for_metrics ratio {g['checked'] / g['unchecked']:.3f}  "
                f"evaluation loop ratio {loop['checked'] / loop['unchecked']:.3f}  (goal < 1.05)\n"
                f"{'':36s} 0.1.0's per-tensor gathers, unchecked {per_call['per_leaf']:8.0f} us: checked ratio to it "
                f"{g['checked'] / g['per_leaf']:.3f}"
            )
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
