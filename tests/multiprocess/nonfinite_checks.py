"""skip_nonfinite on 2 processes (DDP, gloo): a non-finite loss on rank 1 only skips the step on both ranks.

Run: torchrun --nproc_per_node 2 tests/multiprocess/nonfinite_checks.py
Also: preparing the same model (or its DDP wrapper) twice registers it once.
The last line printed on each rank is "NONFINITE CHECKS PASSED <rank>".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from accel_core import Accelerator, GradScalerKwargs, PartialState

STEPS, BAD_STEP = 5, 2
state = PartialState()
rank = state.process_index


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {rank}] {message}")


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
        check(optimizer.step_was_skipped == (step == BAD_STEP and poison is not None), f"step {step} skipped?")
        lrs.append(scheduler.get_last_lr()[0])
    return acc, model, lrs


def weights(model: Any) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def same_on_both_ranks(tensor: torch.Tensor, what: str) -> None:
    everyone = [torch.empty_like(tensor) for _ in range(2)]
    dist.all_gather(everyone, tensor)
    check(torch.equal(everyone[0], everyone[1]), f"{what}: weights differ across ranks: {everyone}")


def check_skips() -> None:
    _, reference, reference_lrs = train(None, leave_out=True)
    for poison in ("nan", "inf"):
        acc, model, lrs = train(poison, leave_out=False)
        check(acc.nonfinite_skips == 1, f"{poison}: {acc.nonfinite_skips} skips counted")
        same_on_both_ranks(weights(model), poison)
        check(torch.equal(weights(model), weights(reference)), f"{poison}: not the run without step {BAD_STEP}")
        # The scheduler did not step on the skipped step: the same schedule as the run without it, one entry longer.
        check(lrs[:BAD_STEP] + lrs[BAD_STEP + 1 :] == reference_lrs, f"{poison}: learning rates {lrs}")
        check(lrs[BAD_STEP] == lrs[BAD_STEP - 1], f"{poison}: the scheduler stepped on the skipped step: {lrs}")
        if rank == 0:
            print(f"ok {poison} loss on rank 1: skipped on both ranks, weights equal the run without the step")
    # fp16: the GradScaler checks the gradients; the guard adds the losses (an inf constant here).
    _, reference16, _ = train(None, leave_out=True, mixed_precision="fp16")
    acc, model, _ = train("inf", leave_out=False, mixed_precision="fp16")
    check(acc.nonfinite_skips == 1, f"fp16: {acc.nonfinite_skips} skips counted")
    same_on_both_ranks(weights(model), "fp16")
    check(torch.equal(weights(model), weights(reference16)), "fp16: not the run without the step")
    check(acc.scaler.get_scale() == 2.0**8, f"fp16: the loss's skip changed the loss scale: {acc.scaler.get_scale()}")
    if rank == 0:
        print("ok fp16: the guard's skip composes with the GradScaler")


def check_prepare_twice() -> None:
    acc = Accelerator()
    model = torch.nn.Linear(3, 2)
    wrapped = acc.prepare(model)
    check(isinstance(wrapped, torch.nn.parallel.DistributedDataParallel), f"not DDP: {type(wrapped)}")
    check(acc.prepare(model) is wrapped and acc.prepare(wrapped) is wrapped, "prepare twice: not the same wrapper")
    check(len(acc._models) == 1, f"{len(acc._models)} models registered")
    if rank == 0:
        print("ok prepare(model) twice under DDP: the same wrapper, registered once")


if __name__ == "__main__":
    check_skips()
    check_prepare_twice()
    print(f"NONFINITE CHECKS PASSED {rank}", flush=True)
    state.destroy_process_group()
