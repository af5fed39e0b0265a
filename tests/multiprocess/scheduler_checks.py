"""LR scheduler stepping on 2 processes, written as an Accelerate user writes it (only the import changed).

Accelerate's rule (the default): each real optimizer step advances a prepared scheduler once per
process (once with split_batches), never on accumulation micro-steps or fp16-skipped steps, and
never past OneCycleLR's total_steps. The expected learning rates come from closed-form schedules
evaluated at the scheduler step the rule gives, not from accel's wrapper.
Each ``@check`` is one test of tests/core/test_scheduler_stepping.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import math
import os

import torch
from checklist import check, expect, run_checks
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import GradientAccumulationPlugin, GradScalerKwargs

BASE_LR = 0.1
rank = int(os.environ["RANK"])


def fresh(**kwargs):
    from accel import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(**kwargs)


def warmup_then_linear(total: int, warmup: int):
    """The usual transformers-style schedule; lr factor at scheduler step s."""
    return lambda s: s / warmup if s < warmup else max(0.0, (total - s) / (total - warmup))


def train(accelerator: Accelerator, loader, scheduler_factory, epochs: int = 1, poison_step: int | None = None):
    """The nlp_example loop; returns the lr after each optimizer call (micro-steps included)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    scheduler = scheduler_factory(optimizer)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    lrs = []
    call = 0
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                if poison_step is not None and call == poison_step:
                    loss = loss * float("inf")  # fp16: the scaler finds inf gradients and skips this step
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            lrs.append(scheduler.get_last_lr()[0])
            call += 1
    return lrs, scheduler


def data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@check
def default_per_process() -> None:
    # The script sizes the schedule from the loader before prepare: 64 / 8 = 8 batches.
    loader = DataLoader(data(), batch_size=8)
    total, warmup = len(loader), 2
    accelerator = fresh()
    expect(accelerator.scheduler_stepping == "per_process", f"default stepping {accelerator.scheduler_stepping}")
    lrs, scheduler = train(
        accelerator, loader, lambda o: torch.optim.lr_scheduler.LambdaLR(o, warmup_then_linear(total, warmup))
    )
    expect(len(lrs) == 4, f"4 batches per process, got {len(lrs)}")
    factor = warmup_then_linear(total, warmup)
    expected = [BASE_LR * factor(2 * (i + 1)) for i in range(4)]  # 2 scheduler steps per optimizer step
    expect(all(close(a, b) for a, b in zip(lrs, expected, strict=True)), f"per-process trajectory {lrs} vs {expected}")
    expect(
        scheduler.scheduler.last_epoch == total,
        f"the schedule ends with training: {scheduler.scheduler.last_epoch} vs {total}",
    )
    expect(lrs[-1] == 0.0, "linear decay reaches 0 at the last batch, as on one process")


@check
def accumulation_and_adjust_scheduler() -> None:
    for plugin in (
        None,
        GradientAccumulationPlugin(num_steps=2, adjust_scheduler=True),
        GradientAccumulationPlugin(num_steps=2, adjust_scheduler=False),
    ):
        accelerator = fresh(gradient_accumulation_plugin=plugin) if plugin else fresh(gradient_accumulation_steps=2)
        loader = DataLoader(data(), batch_size=8)
        lrs, scheduler = train(
            accelerator, loader, lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5)
        )
        # 4 micro-batches per process = 2 optimizer steps, each 2 scheduler steps: factors 1, 4, 4, 16 (x 1/..)
        expected = [BASE_LR, BASE_LR * 0.5**2, BASE_LR * 0.5**2, BASE_LR * 0.5**4]
        expect(
            all(close(a, b) for a, b in zip(lrs, expected, strict=True)),
            f"accumulation ({plugin}): {lrs} vs {expected}",
        )
        expect(scheduler.scheduler.last_epoch == 4, f"accumulation: last_epoch {scheduler.scheduler.last_epoch}")


@check
def split_batches_once() -> None:
    accelerator = fresh(split_batches=True)
    loader = DataLoader(data(), batch_size=16)  # split: each process gets 8 of each 16
    lrs, _scheduler = train(accelerator, loader, lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    expect(lrs == [BASE_LR * 0.5 ** (i + 1) for i in range(4)], f"split_batches steps once: {lrs}")


@check
def step_with_optimizer_false() -> None:
    accelerator = fresh(gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    loader = DataLoader(data(), batch_size=8)
    lrs, scheduler = train(accelerator, loader, lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    expect(scheduler.scheduler.last_epoch == 4, f"step_scheduler_with_optimizer=False steps on every call: {lrs}")


@check
def fp16_skipped_step() -> None:
    # A scale below fp16's range, so only the poisoned step overflows (65536, the default, overflows
    # fp16 gradients at once and skips the first steps too: that is GradScaler finding its scale).
    accelerator = fresh(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256.0)])
    loader = DataLoader(data(), batch_size=8)
    lrs, _scheduler = train(
        accelerator, loader, lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5), poison_step=1
    )
    # Step 1 was skipped on both processes (the scaler's inf check is all-reduced by DDP's gradients).
    expected = [BASE_LR * 0.5**2, BASE_LR * 0.5**2, BASE_LR * 0.5**4, BASE_LR * 0.5**6]
    expect(lrs == expected, f"fp16 skipped step keeps the lr: {lrs} vs {expected}")


@check
def one_cycle_total_steps() -> None:
    # 60 samples, batch 8: 8 batches before prepare (the last one short), 4 per process. A script
    # that sized total_steps one short of the 2 x 8 scheduler steps of two epochs: OneCycleLR
    # raises when stepped past it, so the last step must be left out, not taken.
    loader = DataLoader(data(60), batch_size=8)
    total = len(loader) * 2 - 1
    accelerator = fresh()
    lrs, scheduler = train(
        accelerator, loader, lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=total), epochs=2
    )
    reference_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    reference = torch.optim.lr_scheduler.OneCycleLR(reference_opt, max_lr=1.0, total_steps=total)
    expected = []
    for _step in range(len(lrs)):
        for _ in range(2):
            if reference.last_epoch < total:
                reference.step()
        expected.append(reference.get_last_lr()[0])
    expect(len(lrs) == 8, f"8 optimizer steps per process over two epochs, got {len(lrs)}")
    expect(all(close(a, b) for a, b in zip(lrs, expected, strict=True)), f"OneCycleLR trajectory {lrs} vs {expected}")
    expect(
        scheduler.scheduler.last_epoch == total, f"OneCycleLR stops at total_steps: {scheduler.scheduler.last_epoch}"
    )


@check
def per_optimizer_step_option() -> None:
    accelerator = fresh(scheduler_stepping="per_optimizer_step")
    loader = DataLoader(data(), batch_size=8)
    lrs, _ = train(accelerator, loader, lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    expect(lrs == [BASE_LR * 0.5 ** (i + 1) for i in range(4)], f"per_optimizer_step steps once: {lrs}")
    os.environ["ACCEL_SCHEDULER_STEPPING"] = "per_optimizer_step"  # what `accel launch --scheduler-stepping` writes
    try:
        expect(fresh().scheduler_steps_per_optimizer_step == 1, "ACCEL_SCHEDULER_STEPPING is read")
        expect(
            fresh(scheduler_stepping="per_process").scheduler_steps_per_optimizer_step == 2,
            "the argument beats the variable",
        )
    finally:
        del os.environ["ACCEL_SCHEDULER_STEPPING"]
    try:
        fresh(scheduler_stepping="twice")
        expect(False, "an unknown scheduler_stepping must raise")
    except ValueError as error:
        expect("per_optimizer_step" in str(error), f"the error names the choices: {error}")


if __name__ == "__main__":
    run_checks()
