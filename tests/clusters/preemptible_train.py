"""A training script that survives preemption: periodic checkpoints, an emergency one on SIGTERM, ``resume="auto"``.

Usage: ``preemptible_train.py <project_dir>`` under ``srun`` (``preemptible.sbatch`` is the batch file that runs it).
A SIGTERM (SLURM's notice before it preempts or requeues the job) makes every rank save a checkpoint at the end of
the current step and exit 143; the job started again resumes from it, and ends with the same weights as a run never
interrupted.

For the test: each rank appends a line per event to ``<project_dir>/events.jsonl`` (``start`` with
``SLURM_RESTART_COUNT`` and where it resumed, ``step`` after each optimizer step, ``exit`` with the exit code);
rank 0 writes ``final.safetensors``. ``STEP_SECONDS`` (default 0) sleeps after each step of the job's first attempt,
so that a test can requeue the job mid-run; it changes no number. (The attempt after the requeue runs at full speed:
its 25 steps slept 12 s of the test's 31.)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ProjectConfiguration

EPOCHS = 4
project = Path(sys.argv[1])
restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
step_seconds = float(os.environ.get("STEP_SECONDS", "0")) if restart == 0 else 0.0

config = ProjectConfiguration(
    project_dir=str(project),
    automatic_checkpoint_naming=True,
    total_limit=2,
    save_every_n_steps=5,
    checkpoint_on_sigterm=True,
)
accelerator = Accelerator(project_config=config, resume="auto")
rank = accelerator.process_index


def record(event: str, **fields: object) -> None:
    line = {"event": event, "rank": rank, "restart": restart, **fields}
    with open(project / "events.jsonl", "a") as events:
        events.write(json.dumps(line) + "\n")


data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
targets = (data @ torch.randn(8, 1, generator=torch.Generator().manual_seed(2))).squeeze(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
loader = DataLoader(TensorDataset(data, targets), batch_size=4, shuffle=True)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)  # resumes here
record("start", resumed_from=accelerator.resumed_from, completed_steps=accelerator.completed_steps)
if accelerator.is_main_process and accelerator.resumed_from:
    print(f"Resumed from {accelerator.resumed_from} at step {accelerator.completed_steps}", flush=True)

try:
    for _epoch in range(loader.epoch, EPOCHS):  # the epoch to continue, after a resume
        for inputs, labels in loader:
            loss = torch.nn.functional.mse_loss(model(inputs).squeeze(1), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            record("step", step=accelerator.completed_steps)
            time.sleep(step_seconds)
except SystemExit as leaving:  # the emergency checkpoint's exit (143)
    record("exit", code=leaving.code, completed_steps=accelerator.completed_steps)
    raise

if accelerator.is_main_process:
    weights = accelerator.unwrap_model(model).state_dict()
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(project / "final.safetensors"))
record("exit", code=0, completed_steps=accelerator.completed_steps)
accelerator.end_training()
