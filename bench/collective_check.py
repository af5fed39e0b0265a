"""Cost of the agreement check that runs before every gather / gather_for_metrics / broadcast / reduce.

An evaluation set read through a prepared DataLoader (its last batch uneven, so gather_for_metrics
drops the repeated samples) on 2 CPU processes (gloo): each batch goes through a small model, then
``gather_for_metrics((predictions, labels))`` as the reference's examples do. Measured with the
check and with it switched off in this process (bench only: the data then takes the unchecked
path), alternating which goes first, many short repetitions; for each the median over the
repetitions of:

- the time inside gather_for_metrics per call (wall clock), and the ratio checked / unchecked of
  each repetition's pair, median over the pairs;
- the whole evaluation loop (data loading + forward + gather), the same way;
- the CPU time the calling thread spends per gather_for_metrics (``time.thread_time``): the
  Python-side cost of the check, which a loaded machine's scheduling disturbs far less than the
  wall clock of a collective.

Three payloads: class ids (a classifier: argmax and labels, two int64[32]), a batch's logits
(fp32[32, 1000] and labels) and token logits (fp32[32, 128, 1000], a language model's, and labels).
Goal: the check adds under 5% to gather_for_metrics on an evaluation set (ratios < 1.05).

Usage: torchrun --nproc_per_node 2 bench/collective_check.py [--batches 100] [--repeats 15]
(ACCEL_USE_CPU=true for gloo on a machine with a GPU.)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import accel_core.accelerator.metrics_gathering as gathering_module
from accel_core import Accelerator, ops

Payload = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Check:
    """Switches the check off in this process (the bench's 'unchecked' side), and back on."""

    def __init__(self) -> None:
        self.saved = (gathering_module.check_agreement, ops.checked_gather)

    def set(self, on: bool) -> None:
        if on:
            gathering_module.check_agreement, ops.checked_gather = self.saved
        else:
            gathering_module.check_agreement = lambda *args, **kwargs: None
            # What gather_for_metrics did before the check: its tensors packed into as few all_gathers.
            ops.checked_gather = lambda operation, data, group=None, hint="": ops.gather_unchecked(data, group)


Measured = tuple[float, float, float, int]  # gather_for_metrics s, its CPU s, loop s, calls


def per_call(values: list[Measured], field: int) -> float:
    """Median over the repetitions of ``field`` per call, in microseconds."""
    return statistics.median(v[field] / v[3] for v in values) * 1e6


def ratio(on: list[Measured], off: list[Measured], field: int) -> float:
    """Median over the repetitions of checked / unchecked (each repetition's pair ran back to back)."""
    return statistics.median(a[field] / b[field] for a, b in zip(on, off, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description="Cost of the collective agreement check in an evaluation loop.")
    parser.add_argument("--batches", type=int, default=100, help="batches per repetition (per process)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15, help="repetitions of each side, alternating")
    args = parser.parse_args()
    acc = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1000))
    model = acc.prepare_model(model, evaluation_mode=True)
    token_logits = torch.randn(args.batch_size, 128, 1000)
    payloads: dict[str, tuple[Payload, int]] = {
        "class ids (2 x int64[32])": (lambda logits, labels: (logits.argmax(dim=-1), labels), args.batches),
        "logits (fp32[32, 1000] + labels)": (lambda logits, labels: (logits, labels), args.batches),
        # 16 MB per process: fewer batches are enough to time it.
        "token logits (fp32[32, 128, 1000] + labels)": (
            lambda logits, labels: (token_logits[: len(labels)], labels),
            max(3, args.batches // 10),
        ),
    }
    check = Check()

    def evaluation(make: Payload, batches: int) -> Measured:
        """(seconds in gather_for_metrics, CPU seconds of this thread in it, seconds of the loop, calls)."""
        # An uneven evaluation set: the last batch is short on one process and padded by repetition.
        samples = batches * args.batch_size * acc.num_processes - args.batch_size // 2
        dataset = torch.utils.data.TensorDataset(torch.randn(samples, 256), torch.randint(0, 1000, (samples,)))
        loader = acc.prepare_data_loader(torch.utils.data.DataLoader(dataset, batch_size=args.batch_size))
        gather_s = cpu_s = 0.0
        calls = 0
        acc.wait_for_everyone()
        start = time.perf_counter()
        with torch.no_grad():
            for inputs, labels in loader:
                outputs = make(model(inputs), labels)
                wall, cpu = time.perf_counter(), time.thread_time()
                acc.gather_for_metrics(outputs)
                cpu_s += time.thread_time() - cpu
                gather_s += time.perf_counter() - wall
                calls += 1
        return gather_s, cpu_s, time.perf_counter() - start, calls

    rows = []
    for name, (make, batches) in payloads.items():
        evaluation(make, batches)  # warm-up (the checked side learns the data's size)
        measured: dict[bool, list[Measured]] = {True: [], False: []}
        for repeat in range(args.repeats):
            for on in (True, False) if repeat % 2 == 0 else (False, True):  # neither side always goes first
                check.set(on)
                measured[on].append(evaluation(make, batches))
        check.set(True)
        rows.append((name, measured))

    if acc.is_main_process:
        print(
            f"2 processes ({acc.state.backend}), {args.repeats} alternating repetitions, medians; "
            "ratio = checked / unchecked (goal < 1.05):"
        )
        for name, measured in rows:
            on, off = measured[True], measured[False]
            print(
                f"{name}, {on[0][3]} calls per repetition\n"
                f"  gather_for_metrics   unchecked {per_call(off, 0):8.0f} us  checked {per_call(on, 0):8.0f} us  "
                f"ratio {ratio(on, off, 0):.3f}\n"
                f"  evaluation loop      ratio {ratio(on, off, 2):.3f}\n"
                f"  CPU of the caller    unchecked {per_call(off, 1):8.0f} us  checked {per_call(on, 1):8.0f} us  "
                f"ratio {ratio(on, off, 1):.3f}"
            )
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
