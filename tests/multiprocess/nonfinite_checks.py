"""skip_nonfinite on 2 processes (DDP, gloo): a non-finite loss on rank 1 only skips the step on both ranks.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/multiprocess/nonfinite_checks.py
Also: preparing the same model (or its DDP wrapper) twice registers it once. Each ``@check`` is one test of
tests/core/test_guards.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks

from accel_core import Accelerator, GradScalerKwargs, PartialState

STEPS, BAD_STEP = 5, 2
state = PartialState()
rank = state.process_index


def batch(step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(4, 3, generator=generator)


def train(poison: str | None, leave_out: bool, mixed_precision: str = "no") -> tuple[Accelerator, Any, list[float]]:
    """Trains STEPS steps; at BAD_STEP rank 1's loss is poisoned (``nan``: NaN flows into the gradients,
    ``inf``: an inf constant, the gradients stay finite), or the step is left out on every rank."""
    # A small loss scale: the default one overflows fp16 gradients here, and those skips are the scaler's.
    scaler = [GradScalerKwargs(init_scale=2.0**8)] if mixed_precision == "fp16" else None
    acc = Accelerator(skip_nonfinite=poison is not None, mixed_precision=mixed_precision, kwargs_handlers=scaler)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    lrs = []
    for step in range(STEPS):
        if step == BAD_STEP and leave_out:
            continue
        loss = model(batch(step)).pow(2).mean()
        if step == BAD_STEP and rank == 1 and poison == "nan":
            loss = loss * float("nan")
        if step == BAD_STEP and rank == 1 and poison == "inf":
            loss = loss + float("inf")  # the gradients stay finite: only the loss flag can tell
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        expect(optimizer.step_was_skipped == (step == BAD_STEP and poison is not None), f"step {step} skipped?")
        lrs.append(scheduler.get_last_lr()[0])
    return acc, model, lrs


def weights(model: Any) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def same_on_both_ranks(tensor: torch.Tensor, what: str) -> None:
    everyone = [torch.empty_like(tensor) for _ in range(2)]
    dist.all_gather(everyone, tensor)
    expect(torch.equal(everyone[0], everyone[1]), f"{what}: weights differ across ranks: {everyone}")


@cache
def reference_run(mixed_precision: str = "no") -> tuple[torch.Tensor, list[float]]:
    """The weights and learning rates of the run that leaves step BAD_STEP out on every rank."""
    _, reference, reference_lrs = train(None, leave_out=True, mixed_precision=mixed_precision)
    return weights(reference), reference_lrs


def expect_skipped(poison: str) -> None:
    reference_weights, reference_lrs = reference_run()
    acc, model, lrs = train(poison, leave_out=False)
    expect(acc.nonfinite_skips == 1, f"{poison}: {acc.nonfinite_skips} skips counted")
    same_on_both_ranks(weights(model), poison)
    expect(torch.equal(weights(model), reference_weights), f"{poison}: not the run without step {BAD_STEP}")
    # The scheduler did not step on the skipped step: the same schedule as the run without it, one entry longer.
    expect(lrs[:BAD_STEP] + lrs[BAD_STEP + 1 :] == reference_lrs, f"{poison}: learning rates {lrs}")
    expect(lrs[BAD_STEP] == lrs[BAD_STEP - 1], f"{poison}: the scheduler stepped on the skipped step: {lrs}")


@check
def nan_loss_on_one_rank_skips_the_step_on_both() -> None:
    expect_skipped("nan")


@check
def inf_loss_on_one_rank_skips_the_step_on_both() -> None:
    expect_skipped("inf")


@check
def fp16_the_guards_skip_composes_with_the_grad_scaler() -> None:
    # fp16: the GradScaler checks the gradients; the guard adds the losses (an inf constant here).
    reference16, _ = reference_run("fp16")
    acc, model, _ = train("inf", leave_out=False, mixed_precision="fp16")
    expect(acc.nonfinite_skips == 1, f"fp16: {acc.nonfinite_skips} skips counted")
    same_on_both_ranks(weights(model), "fp16")
    expect(torch.equal(weights(model), reference16), "fp16: not the run without the step")
    expect(acc.scaler.get_scale() == 2.0**8, f"fp16: the loss's skip changed the loss scale: {acc.scaler.get_scale()}")


@check
def prepare_twice_under_ddp_registers_the_model_once() -> None:
    acc = Accelerator()
    model = torch.nn.Linear(3, 2)
    wrapped = acc.prepare(model)
    expect(isinstance(wrapped, torch.nn.parallel.DistributedDataParallel), f"not DDP: {type(wrapped)}")
    expect(acc.prepare(model) is wrapped and acc.prepare(wrapped) is wrapped, "prepare twice: not the same wrapper")
    expect(len(acc._models) == 1, f"{len(acc._models)} models registered")


if __name__ == "__main__":
    run_checks(teardown=state.destroy_process_group)
