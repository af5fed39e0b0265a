"""``prepare`` takes Accelerate's MegatronLMDummyScheduler (2 processes, TP=1 x DP=2, gloo).

The learning rates must be those of Megatron-core's OptimizerParamScheduler over the steps
Accelerate's Megatron integration gives it: ``train_iters = total_num_steps // data_parallel_size``
and ``lr_warmup_iters = warmup_num_steps // data_parallel_size``, one step per iteration.
Prints "MEGATRON SCHEDULER CHECKS PASSED <rank>".
"""

from __future__ import annotations

import os
import types

import torch
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import MegatronLMDummyScheduler, MegatronLMPlugin

rank = int(os.environ["RANK"])
TOTAL, WARMUP, LR = 16, 4, 0.5


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"[rank {rank}] {message}")


accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(lr_decay_style="cosine", min_lr=0.01))
dp = accelerator.parallelism_config.data_parallel_size
check(dp == 2, f"TP=1 on 2 processes is DP=2, got {dp}")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=LR)
loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=TOTAL, warmup_num_steps=WARMUP)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
check(type(scheduler).__name__ == "AcceleratedScheduler", f"a prepared scheduler comes back, got {type(scheduler)}")

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
check(abs(scheduler.get_last_lr()[0] - 0.0) < 1e-12, f"warm-up starts at 0, got {scheduler.get_last_lr()}")
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    reference.step(1)
    want = reference.get_lr({"lr": LR})
    got = scheduler.get_last_lr()[0]
    check(abs(got - want) < 1e-12, f"step {step}: lr {got} vs Megatron's {want}")
    check(optimizer.param_groups[0]["lr"] == got, "the optimizer runs at the scheduler's lr")
check(step + 1 == 8 and abs(scheduler.get_last_lr()[0] - 0.01) < 1e-12, "8 steps per process, ending at min_lr")
try:
    accelerator.prepare(MegatronLMDummyScheduler(optimizer.optimizer))
    check(False, "a MegatronLMDummyScheduler without total_num_steps must raise")
except ValueError as error:
    check("total_num_steps" in str(error), f"the error names total_num_steps: {error}")
print(f"MEGATRON SCHEDULER CHECKS PASSED {rank}", flush=True)
