"""Image classification on scikit-learn's handwritten digits (8x8 images, 10 classes), written once,
run anywhere with `accel launch`.

    uv run accel launch --cpu -n 2 examples/train_digits.py

Shows the whole user-facing loop: prepare, accumulate, backward, a scheduler, evaluation through
gather_for_metrics (every test sample counted once), a checkpoint per epoch with resume
(`--resume`), the local tracker and a progress bar on the main process.
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed
from accel_tracking import progress_bar


def datasets(seed: int) -> tuple[TensorDataset, TensorDataset]:
    images, labels = load_digits(return_X_y=True)
    images = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    labels = torch.tensor(labels)
    train_x, test_x, train_y, test_y = train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=labels)
    return TensorDataset(train_x, train_y), TensorDataset(test_x, test_y)


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Dropout(0.25),
        torch.nn.Linear(64 * 4 * 4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--project-dir", default="outputs/digits")
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --project-dir")
    parser.add_argument("--min-accuracy", type=float, default=0.0, help="exit with an error below this test accuracy")
    args = parser.parse_args()

    accelerator = Accelerator(
        log_with="local",
        project_config=ProjectConfiguration(args.project_dir, automatic_checkpoint_naming=True, total_limit=2),
    )
    set_seed(args.seed)
    train_set, test_set = datasets(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=64)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # Written in optimizer steps: accel steps the scheduler once per real optimizer step.
    steps_per_epoch = -(-len(train_set) // (args.batch_size * accelerator.num_processes))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps_per_epoch * args.epochs)
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, test_loader, scheduler
    )
    accelerator.init_trackers("digits", config=vars(args))

    first_epoch = 0
    if args.resume:
        accelerator.load_state()  # newest complete checkpoint under <project-dir>/checkpoints
        first_epoch = accelerator.save_iteration  # one checkpoint per finished epoch
        accelerator.print(f"resumed after epoch {first_epoch}")

    start = time.perf_counter()
    accuracy = 0.0
    for epoch in range(first_epoch, args.epochs):
        model.train()
        total_loss, batches = torch.zeros(()), 0
        for images, labels in progress_bar(train_loader, desc=f"epoch {epoch}", leave=False):
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            total_loss += loss.detach()
            batches += 1
        train_loss = accelerator.reduce(total_loss / batches, reduction="mean").item()

        model.eval()
        correct, seen = 0, 0
        with torch.no_grad():
            for images, labels in test_loader:
                predictions = model(images).argmax(dim=-1)
                predictions, labels = accelerator.gather_for_metrics((predictions, labels))
                correct += (predictions == labels).sum().item()
                seen += labels.numel()
        accuracy = correct / seen
        accelerator.log({"train_loss": train_loss, "test_accuracy": accuracy, "lr": scheduler.get_last_lr()[0]}, step=epoch)
        accelerator.print(
            f"epoch {epoch}: train loss {train_loss:.4f} | test accuracy {accuracy:.4f} on {seen} samples "
            f"| {time.perf_counter() - start:.1f} s"
        )
        accelerator.save_state()

    accelerator.end_training()
    if accuracy < args.min_accuracy:
        raise SystemExit(f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}")


if __name__ == "__main__":
    main()
