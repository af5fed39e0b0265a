"""accel quick start: a small classifier trained on synthetic data,
evaluated every epoch, checkpointed and resumable.

    python train.py                                          # one process
    accel launch --cpu -n 2 train.py --project-dir runs/two  # two
    python train.py --epochs 5 --resume                      # continue
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed


def synthetic_data(samples: int, seed: int) -> TensorDataset:
    """Points in 20 dimensions, labelled by which of 4 fixed directions
    they lie furthest along: a rule the model can learn."""
    rule = torch.Generator().manual_seed(0)  # the same rule for every set
    directions = torch.randn(4, 20, generator=rule)
    points = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 20, generator=points)
    return TensorDataset(inputs, (inputs @ directions.T).argmax(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser(description="accel quick start")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--project-dir", default="runs/quickstart")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    accelerator = Accelerator(
        log_with="local",  # <project-dir>/train/metrics.jsonl
        project_config=ProjectConfiguration(
            args.project_dir,
            automatic_checkpoint_naming=True,
            total_limit=2,
        ),
        resume="auto" if args.resume else None,
    )
    set_seed(0)
    train_set = synthetic_data(4096, seed=1)
    eval_set = synthetic_data(1000, seed=2)
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    eval_loader = DataLoader(eval_set, batch_size=200)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    model, optimizer, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, train_loader, eval_loader
    )
    # With --resume, prepare() has just loaded the newest checkpoint:
    # weights, optimizer, random generators, the loaders' positions.
    accelerator.init_trackers("train", config=vars(args))
    if accelerator.resumed_from:
        steps = accelerator.completed_steps
        accelerator.print(
            f"resumed at epoch {train_loader.epoch} after {steps} steps"
        )

    for epoch in range(train_loader.epoch, args.epochs):
        model.train()
        total_loss = torch.zeros((), device=accelerator.device)
        for inputs, labels in train_loader:  # this process's batches
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(inputs), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            total_loss += loss.detach()
        mean_loss = total_loss / len(train_loader)
        train_loss = accelerator.reduce(mean_loss, reduction="mean").item()

        model.eval()
        correct, seen = 0, 0
        with torch.no_grad():
            for inputs, labels in eval_loader:
                predictions = model(inputs).argmax(dim=1)
                # Every process's predictions, each sample counted once.
                predictions, labels = accelerator.gather_for_metrics(
                    (predictions, labels)
                )
                correct += (predictions == labels).sum().item()
                seen += labels.numel()
        accuracy = correct / seen

        accelerator.log(
            {"train_loss": train_loss, "accuracy": accuracy}, step=epoch
        )
        accelerator.print(
            f"epoch {epoch}: train loss {train_loss:.3f}, "
            f"accuracy {accuracy:.3f} on {seen} samples, "
            f"processes: {accelerator.num_processes}"
        )
        accelerator.save_state()  # <project-dir>/checkpoints/checkpoint_<n>

    accelerator.end_training()


if __name__ == "__main__":
    main()
