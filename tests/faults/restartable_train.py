"""A small training run that survives SIGKILLs: run under ``accel launch --auto-resume --max-restarts N``.

Usage: ``restartable_train.py <project_dir>``. ``FAULT_PLAN`` (JSON, optional) maps an attempt
(``TORCHELASTIC_RESTART_COUNT``) to ``[rank, step, where]``: that rank SIGKILLs itself at that
optimizer step, ``where`` being ``"step"`` (right after the optimizer step, before it is logged)
or ``"save"`` (inside the periodic save of that step, once its hidden folder exists), ``"collective"``
(blocked in ``wait_for_everyone``, which its peers reach a second later) or ``"loading"`` (killed by one
of its DataLoader workers while that worker loads a sample of the next step; needs ``LOADER_WORKERS``
> 0); with
``"sigterm"`` that rank sends itself SIGTERM there, with ``"sigterm-launcher"`` it sends SIGTERM to
its launcher (a cluster's preemption notice), with ``"node"`` it SIGKILLs its launcher and then itself
(a whole machine lost), and ``CHECKPOINT_ON_SIGTERM=1`` turns on the emergency checkpoint. A rank of
``null`` means whichever rank this launch's process has (one node's launch of a multi-node job).

``STEP_DELAY`` (seconds, default 0): each optimizer step sleeps that long and then writes its number to
``<project_dir>/progress_rank<R>``, so that a test can act at a step of a run that lasts (cut a link).

``LOADER_WORKERS``: the prepared loader's ``num_workers`` (default 0). Any strategy: the final weights
are read with ``get_state_dict`` (FSDP2's shards gathered).

Writes ``<project_dir>/final.safetensors`` (rank 0) and one line per attempt and rank to
``<project_dir>/attempts.jsonl``. The script itself has the three lines of auto-resume and no
offsets of its own: where to continue is the Accelerator's business.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration

EPOCHS = 4
SAVE_EVERY = 3
STEP_DELAY = float(os.environ.get("STEP_DELAY", "0"))

project_dir = sys.argv[1]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
plan = json.loads(os.environ.get("FAULT_PLAN", "{}")).get(str(attempt))

config = ProjectConfiguration(
    project_dir=project_dir,
    automatic_checkpoint_naming=True,
    total_limit=2,
    save_every_n_steps=SAVE_EVERY,
    checkpoint_on_sigterm=os.environ.get("CHECKPOINT_ON_SIGTERM") == "1",
)
accelerator = Accelerator(
    project_config=config, gradient_accumulation_steps=2, log_with=["local", "tensorboard"]
)  # resume="auto" comes from `accel launch --auto-resume`
rank = accelerator.process_index


def die_here(where: str) -> None:
    if plan is None or plan[0] not in (None, rank) or plan[1] != accelerator.completed_steps:
        return
    sys.stdout.flush()
    if where == "step" and plan[2] == "node":
        os.kill(os.getppid(), signal.SIGKILL)  # the agent (`accel launch`): its workers die with it
        os.kill(os.getpid(), signal.SIGKILL)
    if plan[2] == where:
        os.kill(os.getpid(), signal.SIGKILL)
    elif where == "step" and plan[2] == "collective":
        # Blocked in the barrier (its peers arrive a second later) when the signal comes.
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        accelerator.wait_for_everyone()
    elif where == "step" and plan[2] == "loading":
        KILL_FLAG.touch()  # the next sample one of this rank's DataLoader workers loads kills the rank
    elif where == "step" and plan[2] == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif where == "step" and plan[2] == "sigterm-launcher":
        os.kill(os.getppid(), signal.SIGTERM)


def peers_of_the_collective_victim() -> None:
    # The other ranks reach the victim's barrier late, so that it dies inside it, then wait there.
    if plan is not None and plan[2] == "collective" and plan[0] != rank and plan[1] == accelerator.completed_steps:
        time.sleep(1.0)
        accelerator.wait_for_everyone()


accelerator.register_save_state_pre_hook(lambda models, weights, folder: die_here("save"))
KILL_FLAG = Path(project_dir) / f".kill_rank_{rank}_attempt_{attempt}"


class Samples(TensorDataset):
    """The samples, loaded by the DataLoader's workers; one of them SIGKILLs its rank when the flag exists."""

    def __getitem__(self, index: int):  # type: ignore[override]
        if KILL_FLAG.exists():
            os.kill(os.getppid(), signal.SIGKILL)
            # Gone with its rank at once: a worker sleeping here outlived the rank (torch's watchdog looks at the
            # parent only between samples) and held the job's pipes open, which cost the cell minutes.
            os._exit(0)
        return super().__getitem__(index)


torch.manual_seed(0)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
targets = (data @ torch.randn(8, 1, generator=torch.Generator().manual_seed(2))).squeeze(1)
workers = int(os.environ.get("LOADER_WORKERS", "0"))
loader = DataLoader(Samples(data, targets), batch_size=4, shuffle=True, num_workers=workers)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
accelerator.init_trackers("run")

with open(os.path.join(project_dir, "attempts.jsonl"), "a") as record:
    record.write(
        json.dumps(
            {
                "attempt": attempt,
                "rank": rank,
                "resumed_from": accelerator.resumed_from,
                "completed_steps": accelerator.completed_steps,
                "epoch": loader.epoch,
            }
        )
        + "\n"
    )

for epoch in range(loader.epoch, EPOCHS):
    for inputs, labels in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs).squeeze(1), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            if STEP_DELAY:
                time.sleep(STEP_DELAY)
                Path(project_dir, f"progress_rank{rank}").write_text(str(accelerator.completed_steps))
            die_here("step")
            peers_of_the_collective_victim()
            accelerator.log(
                {"loss": loss.item(), "lr": scheduler.get_last_lr()[0], "epoch": epoch},
                step=accelerator.completed_steps,
            )

accelerator.wait_for_everyone()
state = accelerator.get_state_dict(model)  # every rank: FSDP2 gathers its shards
if accelerator.is_main_process:
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(project_dir, "final.safetensors"))
accelerator.end_training()
