"""accel-fsdp on ONE process, reading what checkpoint_checks.py wrote with two.

Run: accel launch --cpu -n 1 --use-fsdp --fsdp-transformer-layer-cls-to-wrap Block \
        tests/fsdp/single_process_checks.py <tmp_dir>
(one process: accel launch runs the script directly, without torchrun or RANK/WORLD_SIZE).
Ends with "FSDP SINGLE PROCESS CHECKS PASSED".
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from fsdp_testlib import LR, Net, data, make_net, param_groups
from torch import nn

from accel_checkpoint import load_model, merge_sharded_checkpoint
from accel_core import Accelerator
from accel_fsdp import FSDPStrategy

TMP = Path(sys.argv[1])
TOL = 1e-5
expected = torch.load(TMP / "expected.pt", weights_only=True)
probe_input = expected["probe"]


def check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def probe(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(probe_input)


# A plain nn.Module loads the consolidated weights that save_model wrote with two processes.
plain = Net()
load_model(plain, str(TMP / "export"))
check(torch.equal(probe(plain), expected["final_out"]), "save_model output: a plain module gives other outputs")

# The 2-process sharded checkpoint merged into one file, read by a plain module.
merged = merge_sharded_checkpoint(str(TMP / "ckpt"), str(TMP / "merged"))
plain = Net()
load_model(plain, merged)
check(torch.equal(probe(plain), expected["saved_out"]), "merged sharded checkpoint: other outputs")

# The same, merged by `accel merge-weights` (test_fsdp_multiprocess.py ran it) into the file named on its command line.
cli_merged = TMP / "cli_merged.safetensors"
plain = Net()
check(not torch.equal(probe(plain), expected["saved_out"]), "a fresh module already gives the saved outputs")
load_model(plain, str(cli_merged))
check(torch.equal(probe(plain), expected["saved_out"]), "accel merge-weights: the merged file gives other outputs")

# The same checkpoint loaded by the fsdp strategy on one process (DCP reshards 2 -> 1).
accelerator = Accelerator()
check(isinstance(accelerator.strategy, FSDPStrategy), f"--use-fsdp gave {type(accelerator.strategy).__name__}")
check(
    accelerator.num_processes == 1 and dist.is_initialized() and dist.get_world_size() == 1, "expected a group of one"
)
model = make_net(seed=99)
optimizer = torch.optim.AdamW(param_groups(model), lr=LR)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
accelerator.load_state(str(TMP / "ckpt"))
check(torch.equal(probe(model), expected["saved_out"]), "2-process checkpoint on 1 process: outputs differ")

# Continued training on the whole global batch follows the 2-process run (mean of its two halves).
losses = []
for step in range(3, 6):
    x, y = data(step)
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    losses.append(loss.item())
for got, want in zip(losses, expected["continued_global_losses"], strict=True):
    check(
        abs(got - want) <= TOL * max(1.0, abs(want)),
        f"continued losses {losses} != {expected['continued_global_losses']}",
    )
worst = (probe(model) - expected["final_out"]).abs().max().item()
check(worst <= 1e-4, f"weights after continued training differ from the 2-process run by {worst}")
print("FSDP SINGLE PROCESS CHECKS PASSED", flush=True)
