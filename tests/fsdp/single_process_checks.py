"""accel-fsdp on ONE process, reading what checkpoint_checks.py wrote with two.

Run: accel launch --cpu -n 1 --use-fsdp --fsdp-transformer-layer-cls-to-wrap Block \
        tests/fsdp/single_process_checks.py <tmp_dir>
(one process: accel launch runs the script directly, without torchrun or RANK/WORLD_SIZE; PYTHONPATH=tests/harness).
Each ``@check`` is one test of test_fsdp_multiprocess.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from fsdp_testlib import LR, Net, data, make_net, param_groups
from torch import nn

from accel_checkpoint import load_model, merge_sharded_checkpoint
from accel_core import Accelerator
from accel_fsdp import FSDPStrategy

TMP = Path(sys.argv[1])
TOL = 1e-5
expected = torch.load(TMP / "expected.pt", weights_only=True)
probe_input = expected["probe"]


RUN: dict = {}  # the one-process run, for the check after the one that builds it


def probe(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(probe_input)


@check
def save_model_weights_load_into_a_plain_module() -> None:
    # A plain nn.Module loads the consolidated weights that save_model wrote with two processes.
    plain = Net()
    load_model(plain, str(TMP / "export"))
    expect(torch.equal(probe(plain), expected["final_out"]), "save_model output: a plain module gives other outputs")


@check
def merged_sharded_checkpoint_loads_into_a_plain_module() -> None:
    # The 2-process sharded checkpoint merged into one file, read by a plain module.
    merged = merge_sharded_checkpoint(str(TMP / "ckpt"), str(TMP / "merged"))
    plain = Net()
    load_model(plain, merged)
    expect(torch.equal(probe(plain), expected["saved_out"]), "merged sharded checkpoint: other outputs")


@check
def accel_merge_weights_file_loads_into_a_plain_module() -> None:
    # Merged by `accel merge-weights` (test_fsdp_multiprocess.py ran it) into the file named on its command line.
    cli_merged = TMP / "cli_merged.safetensors"
    plain = Net()
    expect(not torch.equal(probe(plain), expected["saved_out"]), "a fresh module already gives the saved outputs")
    load_model(plain, str(cli_merged))
    expect(torch.equal(probe(plain), expected["saved_out"]), "accel merge-weights: the merged file gives other outputs")


@check
def fsdp_on_one_process_loads_the_two_process_checkpoint() -> None:
    # The same checkpoint loaded by the fsdp strategy on one process (DCP reshards 2 -> 1).
    accelerator = Accelerator()
    expect(isinstance(accelerator.strategy, FSDPStrategy), f"--use-fsdp gave {type(accelerator.strategy).__name__}")
    expect(
        accelerator.num_processes == 1 and dist.is_initialized() and dist.get_world_size() == 1,
        "expected a group of one",
    )
    model = make_net(seed=99)
    optimizer = torch.optim.AdamW(param_groups(model), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.load_state(str(TMP / "ckpt"))
    expect(torch.equal(probe(model), expected["saved_out"]), "2-process checkpoint on 1 process: outputs differ")
    RUN.update(accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler)


@check
def continued_training_follows_the_two_process_run() -> None:
    # Continued training on the whole global batch follows the 2-process run (mean of its two halves).
    accelerator, model, optimizer, scheduler = RUN["accelerator"], RUN["model"], RUN["optimizer"], RUN["scheduler"]
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
        expect(
            abs(got - want) <= TOL * max(1.0, abs(want)),
            f"continued losses {losses} != {expected['continued_global_losses']}",
        )
    worst = (probe(model) - expected["final_out"]).abs().max().item()
    expect(worst <= 1e-4, f"weights after continued training differ from the 2-process run by {worst}")


if __name__ == "__main__":
    run_checks()
