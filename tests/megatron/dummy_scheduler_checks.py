"""``prepare`` takes Accelerate's MegatronLMDummyScheduler (2 processes, TP=1 x DP=2, gloo).

The learning rates must be those of Megatron-core's OptimizerParamScheduler over the steps
Accelerate's Megatron integration gives it: ``train_iters = total_num_steps // data_parallel_size``
and ``lr_warmup_iters = warmup_num_steps // data_parallel_size``, one step per iteration.
Each ``@check`` is one test of test_megatron_runs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import types
from functools import cache

import torch
from checklist import check, expect, run_checks
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import MegatronLMDummyScheduler, MegatronLMPlugin

TOTAL, WARMUP, LR = 16, 4, 0.5


@cache
def prepared() -> types.SimpleNamespace:
    """The prepared run, built by the first check rather than at import: tests/megatron/two_process_checks.py imports
    this script next to others whose checks must run first, with their own Megatron groups."""
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(lr_decay_style="cosine", min_lr=0.01))
    dp = accelerator.parallelism_config.data_parallel_size
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=TOTAL, warmup_num_steps=WARMUP)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    reference = OptimizerParamScheduler(
        types.SimpleNamespace(param_groups=[{"lr": LR}]),
        init_lr=0.0,
        max_lr=LR,
        min_lr=0.01,
        lr_warmup_steps=WARMUP // dp,
        lr_decay_steps=TOTAL // dp,
        lr_decay_style="cosine",
        start_wd=0.0,
        end_wd=0.0,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    return types.SimpleNamespace(
        accelerator=accelerator,
        dp=dp,
        model=model,
        optimizer=optimizer,
        loader=loader,
        scheduler=scheduler,
        reference=reference,
    )


@check
def two_processes_with_tp_1_are_dp_2() -> None:
    dp = prepared().dp
    expect(dp == 2, f"TP=1 on 2 processes is DP=2, got {dp}")


@check
def prepare_returns_an_accelerated_scheduler() -> None:
    scheduler = prepared().scheduler
    expect(
        type(scheduler).__name__ == "AcceleratedScheduler", f"a prepared scheduler comes back, got {type(scheduler)}"
    )


@check
def warm_up_starts_at_0() -> None:
    scheduler = prepared().scheduler
    expect(abs(scheduler.get_last_lr()[0] - 0.0) < 1e-12, f"warm-up starts at 0, got {scheduler.get_last_lr()}")


@check
def learning_rates_follow_megatrons_scheduler() -> None:
    run = prepared()
    accelerator, model, optimizer, loader, scheduler, reference = (
        run.accelerator,
        run.model,
        run.optimizer,
        run.loader,
        run.scheduler,
        run.reference,
    )
    step = -1
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        reference.step(1)
        want = reference.get_lr({"lr": LR})
        got = scheduler.get_last_lr()[0]
        expect(abs(got - want) < 1e-12, f"step {step}: lr {got} vs Megatron's {want}")
        expect(optimizer.param_groups[0]["lr"] == got, "the optimizer runs at the scheduler's lr")
    expect(step + 1 == 8 and abs(scheduler.get_last_lr()[0] - 0.01) < 1e-12, "8 steps per process, ending at min_lr")


@check
def a_dummy_scheduler_without_total_num_steps_is_refused() -> None:
    accelerator, optimizer = prepared().accelerator, prepared().optimizer
    try:
        accelerator.prepare(MegatronLMDummyScheduler(optimizer.optimizer))
        expect(False, "a MegatronLMDummyScheduler without total_num_steps must raise")
    except ValueError as error:
        expect("total_num_steps" in str(error), f"the error names total_num_steps: {error}")


if __name__ == "__main__":
    run_checks()
