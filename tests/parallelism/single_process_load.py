"""The TP2 x FSDP2 checkpoint of mesh_checks.py on one plain process: full weights, same continuation.

Run: python tests/parallelism/single_process_load.py <folder>   (no torchrun, no process group)
The loaded weights equal the ``save_model`` export written at the same step, and the next 5 steps
follow the 4-process run within 1e-6 (relative). Ends with "SINGLE PROCESS LOAD PASSED".
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from tinyllama import loss_of, make_model, token_data
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DataLoaderConfiguration

FOLDER = sys.argv[1]

accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
assert accelerator.strategy.name == "single_device" and not dist.is_initialized(), accelerator
model = make_model(7)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
loader = DataLoader(TensorDataset(token_data(64, seed=9)), batch_size=8, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
accelerator.load_state(os.path.join(FOLDER, "ckpt"))

exported = load_file(os.path.join(FOLDER, "export", "model.safetensors"))
state = model.state_dict()
assert set(exported) == set(state), sorted(set(exported) ^ set(state))
for name, tensor in state.items():
    assert type(tensor) is torch.Tensor and torch.equal(tensor, exported[name]), f"{name} differs from the export"

with open(os.path.join(FOLDER, "expected.json")) as handle:
    expected = json.load(handle)["losses"]
losses = []
iterator = iter(loader)
for _ in range(5):
    (batch,) = next(iterator)
    loss = loss_of(model, batch)
    accelerator.backward(loss)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(losses, expected, strict=True))
assert worst <= 1e-6, f"one-process continuation {losses} vs {expected}: {worst:.2e}"
print(f"ONE PROCESS: full weights equal the export; continuation max relative |dloss|={worst:.2e}")
print("SINGLE PROCESS LOAD PASSED")
