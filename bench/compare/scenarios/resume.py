"""Exact resume: a run checkpointed mid-epoch and resumed in a new process ends with the same weights, bit for bit,
as the run that was never interrupted.

Two launches: `phase=reference` trains 2 epochs of a shuffled loader through a model with dropout (so the data
order and the RNG streams both matter), saving at micro-step 4 (mid-epoch) and writing its final weights;
`phase=resume` builds everything afresh, loads the checkpoint the framework's documented way (accel: load_state;
Accelerate: load_state + skip_first_batches; Fabric: fabric.load of model/optimizer/scheduler + skipping the
consumed batches; raw: torch.load of weights/optimizer/scheduler/RNG + skipping) and compares.
"""

from __future__ import annotations

import json
import os

import torch
from torch.utils.data import TensorDataset

EPOCHS, SAVE_AT, BATCH = 2, 4, 8


def _objects(harness):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(64, 16)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.8)
    generator = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(96, 16, generator=generator), torch.randn(96, 16, generator=generator))
    model, optimizer, scheduler = harness.prepare(model, optimizer, scheduler)
    return model, optimizer, scheduler, harness.loader(dataset, BATCH, shuffle=True)


def _weights(harness, model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in harness.unwrap(model).state_dict().items()}


def run(harness, quick: bool = False, phase: str = "reference", dir: str = ".", **_: str) -> dict:
    model, optimizer, scheduler, loader = _objects(harness)
    ckpt, meta_path, ref_path = os.path.join(dir, "ckpt"), os.path.join(dir, "meta.json"), os.path.join(dir, "ref.pt")
    start_epoch, skip, micro = 0, 0, 0
    if phase == "resume":
        with open(meta_path) as f:
            meta = json.load(f)
        start_epoch, skip, micro = meta["epoch"], meta["in_epoch"], SAVE_AT
        harness.load(ckpt, model, optimizer, scheduler)
        harness.micro = micro
    model.train()
    for epoch in range(start_epoch, EPOCHS):
        harness.start_epoch(loader, epoch)
        batches = harness.skip(loader, skip) if epoch == start_epoch and skip else loader
        in_epoch = skip if epoch == start_epoch else 0
        for x, y in batches:
            harness.train_step(model, optimizer, scheduler, x, y)
            micro, in_epoch = micro + 1, in_epoch + 1
            if phase == "reference" and micro == SAVE_AT:
                harness.save(ckpt, model, optimizer, scheduler)
                if harness.rank == 0:
                    with open(meta_path, "w") as f:
                        json.dump({"epoch": epoch, "in_epoch": in_epoch}, f)
    final = _weights(harness, model)
    harness.barrier()
    if phase == "reference":
        if harness.rank == 0:
            torch.save(final, ref_path)
        return {"steps": micro}
    reference = torch.load(ref_path, weights_only=True)
    diff = max((final[k] - reference[k]).abs().max().item() for k in reference)
    return {"exact": diff == 0.0, "max_abs_diff": diff, "steps": micro}
