"""Image classification on scikit-learn's handwritten digits (8x8 images, 10 classes), written once,
run anywhere with `accel launch`.

    uv run accel launch --cpu -n 2 examples/train_digits.py

Shows the whole user-facing loop: prepare, accumulate, backward, a scheduler, evaluation through
gather_for_metrics (every test sample counted once), a checkpoint per epoch with resume
(`--resume`), the local tracker and a progress bar on the main process.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed
from accel_tracking import progress_bar


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 1797 digits, read from its data file without importing scikit-learn: that import
    brings scipy, pyarrow and a second OpenMP runtime into every process, for nothing the training needs."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("This example trains on scikit-learn's digits data: pip install scikit-learn")
    data = np.loadtxt(
        Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz", delimiter=","
    )
    images = torch.tensor(data[:, :-1], dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    return images, torch.tensor(data[:, -1], dtype=torch.long)


def datasets(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """A seeded split: 20% of each class for testing (the same split on every process)."""
    images, labels = load_digits()
    generator = torch.Generator().manual_seed(seed)
    test = torch.zeros(len(labels), dtype=torch.bool)
    for digit in labels.unique():
        members = (labels == digit).nonzero().flatten()
        chosen = members[torch.randperm(len(members), generator=generator)[: round(0.2 * len(members))]]
        test[chosen] = True
    return TensorDataset(images[~test], labels[~test]), TensorDataset(images[test], labels[test])


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Dropout(0.25),
        torch.nn.Linear(64 * 4 * 4, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 10),
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
    # Sized from the loader before prepare, as in Accelerate: each optimizer step advances the
    # scheduler once per process, so the cosine ends with the last epoch on any number of processes.
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(train_loader) * args.epochs)
    model, optimizer, train_loader, test_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, test_loader, scheduler
    )
    accelerator.init_trackers("digits", config=vars(args))

    first_epoch = 0
    checkpoints = Path(args.project_dir, "checkpoints")
    if not args.resume:
        # A new run numbers its checkpoints from 0 (automatic_checkpoint_naming), where an earlier run's would be
        # in the way: it starts over in the same folder, saying so (a second run of the README's command). Every
        # process looks before the main one deletes: one that looked after would skip the barrier below and hang.
        earlier_run = checkpoints.is_dir() and any(checkpoints.iterdir())
        accelerator.wait_for_everyone()
        if earlier_run:
            where = f"the earlier run's checkpoints in {checkpoints}"
            accelerator.print(f"starting over: {where} go (--resume continues it)")
            if accelerator.is_main_process:
                shutil.rmtree(checkpoints)
            accelerator.wait_for_everyone()
    if args.resume:
        accelerator.load_state()  # newest complete checkpoint under <project-dir>/checkpoints
        first_epoch = accelerator.save_iteration  # one checkpoint per finished epoch
        accelerator.print(f"resumed after epoch {first_epoch}")

    start = time.perf_counter()
    accuracy = 0.0
    newest_checkpoint = None
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
        accelerator.log(
            {"train_loss": train_loss, "test_accuracy": accuracy, "lr": scheduler.get_last_lr()[0]}, step=epoch
        )
        accelerator.print(
            f"epoch {epoch}: train loss {train_loss:.4f} | test accuracy {accuracy:.4f} on {seen} samples "
            f"| {time.perf_counter() - start:.1f} s"
        )
        newest_checkpoint = accelerator.save_state()

    accelerator.end_training()
    # Say where the run's files are: relative to the folder `accel launch` ran in, easy to miss.
    checkpoints = checkpoints.resolve()
    metrics = Path(accelerator.logging_dir or args.project_dir, "digits", "metrics.jsonl").resolve()
    newest = f" (newest: {Path(newest_checkpoint).name}; --resume continues from it)" if newest_checkpoint else ""
    accelerator.print(
        f"checkpoints: {checkpoints}{newest}\nmetrics: {metrics}\n"
        f"plot them: accel plot {metrics.parent}  (writes {metrics.parent / 'metrics.png'}; needs matplotlib: "
        'pip install "accel-tracking[plot]")'
    )
    if accuracy < args.min_accuracy:
        raise SystemExit(f"test accuracy {accuracy:.4f} is below --min-accuracy {args.min_accuracy}")


if __name__ == "__main__":
    main()
