"""Optimizer offload to CPU and a save_state / load_state round trip, in one 2-process launch.

Started by `accel launch --cpu -n 2 --use-deepspeed --zero-stage 2 --offload-optimizer-device cpu
--gradient-clipping 1.0 tests/deepspeed/offload_checkpoint_checks.py <tmp_dir>`: the Accelerator is
built without arguments, so the strategy and its plugin come from the launcher's ACCEL_* variables.
Each ``@check`` is one test of test_deepspeed_runs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path

import ds_testlib as T
import torch
import torch.distributed as dist
from checklist import check, expect, run_checks

from accel_checkpoint.errors import UnsafeCheckpointError
from accel_core import Accelerator
from accel_deepspeed import DeepSpeedStrategy
from accel_deepspeed.checkpointing import DEEPSPEED_CHECKPOINT_GLOBALS

TMP = Path(sys.argv[1])
FIGURES: dict[str, object] = {}
SAVE_AFTER = 3  # batches of the second epoch before saving


def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.5 * step))


def build(seed: int):
    accelerator = Accelerator()
    model = T.mlp(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=T.LR)
    loader = torch.utils.data.DataLoader(T.regression_data(), batch_size=T.BATCH, shuffle=True)
    engine, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, schedule(optimizer))
    return accelerator, engine, optimizer, loader, scheduler


def expect_offload_from_launcher() -> tuple:
    accelerator, engine, optimizer, loader, scheduler = build(seed=0)
    strategy = accelerator.strategy
    expect(isinstance(strategy, DeepSpeedStrategy), f"the launcher's --use-deepspeed selects DeepSpeed, got {strategy}")
    plugin = strategy.plugin
    expect(
        plugin.zero_stage == 2 and plugin.offload_optimizer_device == "cpu" and plugin.gradient_clipping == 1.0,
        f"{plugin}",
    )
    expect(engine.zero_cpu_offload(), "the engine offloads the optimizer")
    base = type(engine.optimizer.optimizer).__name__
    expect(base == "DeepSpeedCPUAdam", f"torch AdamW becomes DeepSpeedCPUAdam for offload, got {base}")
    losses, batches = T.train_accel(accelerator, engine, optimizer, loader, scheduler=scheduler, clip=1.0)
    reference, norms, _ = T.train_ddp(T.mlp, batches, clip=1.0, make_scheduler=schedule)
    expect(max(norms) > 1.5, "clipping must be active for this comparison")
    expect(T.close(losses, reference, 1e-4, 1e-5), f"offload losses {losses} vs DDP {reference}")
    expected_lr = 1.0 / (1.0 + 0.5 * len(batches)) * T.LR
    expect(abs(scheduler.get_last_lr()[0] - expected_lr) < 1e-12, f"lr {scheduler.get_last_lr()} vs {expected_lr}")
    FIGURES["offload_max_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
    return accelerator, engine, optimizer, loader, scheduler


def expect_round_trip(accelerator, engine, optimizer, loader, scheduler) -> None:
    folder = TMP / "ckpt"
    after_save: list[float] = []
    for i, (x, y) in enumerate(loader):  # second epoch: save part-way (end of an iteration), then keep training
        loss = torch.nn.functional.mse_loss(engine(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if i >= SAVE_AFTER:
            after_save.append(loss.item())
        if i == SAVE_AFTER - 1:
            accelerator.save_state(folder)
            saved_step = engine.global_steps
    sharded = folder / "sharded" / "model_0"
    expect(
        sharded.is_dir() and any(sharded.glob("*optim_states.pt")),
        f"DeepSpeed files inside accel's layout: {list(sharded.glob('*'))}",
    )
    found = sorted(
        {name for f in sharded.glob("*.pt") for name in torch.serialization.get_unsafe_globals_in_checkpoint(str(f))}
    )
    FIGURES["checkpoint_globals"] = found
    expect(set(found) <= DEEPSPEED_CHECKPOINT_GLOBALS, f"DeepSpeed checkpoint globals outside the allowlist: {found}")

    # A fresh run (other initial weights) resumes from the checkpoint and must continue identically.
    accelerator2, engine2, optimizer2, loader2, scheduler2 = build(seed=123)
    accelerator2.load_state(folder)
    expect(engine2.global_steps == saved_step, f"engine steps {engine2.global_steps} vs {saved_step} at save")
    resumed: list[float] = []
    for x, y in loader2:  # the loader resumes at batch SAVE_AFTER of the saved epoch
        loss = torch.nn.functional.mse_loss(engine2(x), y)
        accelerator2.backward(loss)
        optimizer2.step()
        scheduler2.step()
        optimizer2.zero_grad()
        resumed.append(loss.item())
    expect(resumed == after_save, f"continuation after load_state {resumed} differs from the original {after_save}")
    expect(scheduler2.get_last_lr() == scheduler.get_last_lr(), "scheduler continues identically")
    FIGURES["resumed_steps_identical"] = len(resumed)

    # A checkpoint whose DeepSpeed files would import something else is refused on every rank.
    tampered = TMP / "ckpt_tampered"
    if accelerator2.is_main_process:
        shutil.copytree(folder, tampered)
        torch.save({"hook": os.getcwd}, tampered / "sharded" / "model_0" / "extra.pt")
    accelerator2.wait_for_everyone()
    try:
        accelerator2.load_state(tampered)
    except UnsafeCheckpointError as error:
        expect("posix.getcwd" in str(error) or "getcwd" in str(error), f"the refusal names the import: {error}")
    else:
        raise AssertionError("a DeepSpeed checkpoint importing os.getcwd must be refused")

    # free_memory() tears the strategy down: CPU Adam's native state is destroyed now, while the script still holds
    # the engine (the first run's stays for the exit: its teardown then keeps the process from aborting as it ends).
    cpu_adam = engine2.optimizer.optimizer
    expect(hasattr(cpu_adam, "ds_opt_adam"), f"{type(cpu_adam).__name__} holds a native handle while training")
    accelerator2.free_memory()
    expect(accelerator2.strategy.engine is None, "free_memory() released the engine")
    expect(not hasattr(cpu_adam, "ds_opt_adam"), "free_memory() destroyed CPU Adam's native state")


RUN: list = []  # the offloaded run's objects, for the round trip after it


@check
def optimizer_offload_from_the_launcher_follows_ddp() -> None:
    RUN[:] = expect_offload_from_launcher()


@check
def save_state_load_state_continues_the_run() -> None:
    expect_round_trip(*RUN)


def print_figures() -> None:
    """The figures the test module reads, printed once every check has run."""
    if dist.get_rank() == 0:
        print("FIGURES " + json.dumps(FIGURES), flush=True)


if __name__ == "__main__":
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    run_checks(teardown=print_figures)
