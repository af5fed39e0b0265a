"""A small training run that survives SIGKILLs: run under ``accel launch --auto-resume --max-restarts N``.

Usage: ``restartable_train.py <project_dir>``. ``FAULT_PLAN`` (JSON, optional) maps an attempt
(``TORCHELASTIC_RESTART_COUNT``) to ``[rank, step, where]``: that rank SIGKILLs itself at that
optimizer step, ``where`` being ``"step"`` (right after the optimizer step, before it is logged)
or ``"save"`` (inside the periodic save of that step, once its hidden folder exists); with
``"sigterm"`` that rank sends itself SIGTERM there, with ``"sigterm-launcher"`` it sends SIGTERM to
its launcher (a cluster's preemption notice), with ``"node"`` it SIGKILLs its launcher and then itself
(a whole machine lost), and ``CHECKPOINT_ON_SIGTERM=1`` turns on the emergency checkpoint. A rank of
``null`` means whichever rank this launch's process has (one node's launch of a multi-node job).

Writes ``<project_dir>/final.safetensors`` (rank 0) and one line per attempt and rank to
``<project_dir>/attempts.jsonl``. The script itself has the three lines of auto-resume and no
offsets of its own: where to continue is the Accelerator's business.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration

EPOCHS = 4
SAVE_EVERY = 3

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
    elif where == "step" and plan[2] == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif where == "step" and plan[2] == "sigterm-launcher":
        os.kill(os.getppid(), signal.SIGTERM)


accelerator.register_save_state_pre_hook(lambda models, weights, folder: die_here("save"))

torch.manual_seed(0)
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
targets = (data @ torch.randn(8, 1, generator=torch.Generator().manual_seed(2))).squeeze(1)
loader = DataLoader(TensorDataset(data, targets), batch_size=4, shuffle=True)
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
            die_here("step")
            accelerator.log(
                {"loss": loss.item(), "lr": scheduler.get_last_lr()[0], "epoch": epoch},
                step=accelerator.completed_steps,
            )

accelerator.wait_for_everyone()
if accelerator.is_main_process:
    state = accelerator.unwrap_model(model).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(project_dir, "final.safetensors"))
accelerator.end_training()
