"""A run whose world size changes: under ``accel launch --num-machines 1:2 --keep-global-batch --auto-resume``.

Usage: ``elastic_train.py <project_dir>``. Every process appends one line per optimizer step to
``<project_dir>/samples.jsonl``: the world size, the gradient accumulation it ran with, the step, the
epoch and the ids of the samples it consumed in that step, so a test can account for every sample
across the changes. Rank 0 writes ``final.json`` (the loss over the whole dataset) at the end.

``LOSE_NODE_AT=<step>`` (given to one node's launch only): that node's process SIGKILLs its agent and
itself after that optimizer step, in a world of 2 (the machine lost; the test gives the node started again a later
step, so that it is lost a second time). ``PAUSE_ALONE_AT=<step>``: a
process running alone stops after that step's periodic save and waits (at most 10 minutes) for its
agent to restart it, so that a returning node meets the job while it still has steps to go.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration

EPOCHS = 3
SAVE_EVERY = 2
SAMPLES = 64

project_dir = sys.argv[1]
lose_at = int(os.environ.get("LOSE_NODE_AT", "0"))
pause_at = int(os.environ.get("PAUSE_ALONE_AT", "0"))

config = ProjectConfiguration(
    project_dir=project_dir, automatic_checkpoint_naming=True, total_limit=3, save_every_n_steps=SAVE_EVERY
)
# The LR scheduler advances once per optimizer step, whatever the world size.
accelerator = Accelerator(project_config=config, scheduler_stepping="per_optimizer_step")
rank, world = accelerator.process_index, accelerator.num_processes

torch.manual_seed(0)
ids = torch.arange(SAMPLES)
data = torch.randn(SAMPLES, 8, generator=torch.Generator().manual_seed(1))
targets = (data @ torch.randn(8, 1, generator=torch.Generator().manual_seed(2))).squeeze(1)
loader = DataLoader(TensorDataset(ids, data, targets), batch_size=4, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=6, gamma=0.7)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
round_key = f"{accelerator.resumed_from}|{world}"  # the processes of one round share it

record = open(os.path.join(project_dir, "samples.jsonl"), "a")  # noqa: SIM115 (open for the whole run)
step_ids: list[int] = []
for epoch in range(loader.epoch, EPOCHS):
    for batch_ids, inputs, labels in loader:
        if pause_at and world == 1 and accelerator.completed_steps == pause_at:
            record.write(json.dumps({"paused": pause_at}) + "\n")
            record.flush()
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:  # the agent restarts this process when a node joins
                time.sleep(0.5)
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs).squeeze(1), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        step_ids += batch_ids.tolist()
        if accelerator.sync_gradients:
            line = {"round": round_key, "world": world, "rank": rank, "step": accelerator.completed_steps}
            line.update(accumulation=accelerator.gradient_accumulation_steps, epoch=epoch, ids=step_ids)
            record.write(json.dumps(line) + "\n")
            record.flush()
            step_ids = []
            if lose_at and world == 2 and accelerator.completed_steps == lose_at:
                os.kill(os.getppid(), signal.SIGKILL)  # the agent (`accel launch`): the whole node is lost
                os.kill(os.getpid(), signal.SIGKILL)

accelerator.wait_for_everyone()
if accelerator.is_main_process:
    with torch.no_grad():
        full = accelerator.unwrap_model(model)(data).squeeze(1)
        final_loss = torch.nn.functional.mse_loss(full, targets).item()
    with open(os.path.join(project_dir, "final.json"), "w") as out:
        json.dump({"loss": final_loss, "steps": accelerator.completed_steps}, out)
accelerator.end_training()
