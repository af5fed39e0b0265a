"""Track a run without any server: the local tracker's JSON lines, a progress bar, and a PNG of the loss.

    uv run accel launch --cpu -n 2 examples/tracking_local.py --project-dir outputs/tracking
    # or: torchrun --nproc_per_node 2 examples/tracking_local.py --project-dir outputs/tracking

However many processes run, one set of logs is written (by the main process):
``<project-dir>/<run>/metrics.jsonl`` and ``config.json``, then ``loss.png`` drawn from them.
Add ``--tensorboard`` to also write TensorBoard event files next to them.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel_tracking import plot_metrics, progress_bar


def make_data(n: int, seed: int) -> TensorDataset:
    # y = sin(x) + noise: a curve a small MLP learns in a few hundred steps on a CPU.
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=generator) * 2 * math.pi - math.pi
    y = torch.sin(x) + 0.05 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project-dir", default="outputs/tracking")
    parser.add_argument("--run-name", default="sine")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--tensorboard", action="store_true", help="also log to TensorBoard")
    args = parser.parse_args(argv)

    log_with = ["local", "tensorboard"] if args.tensorboard else ["local"]
    accelerator = Accelerator(log_with=log_with, project_dir=args.project_dir)
    torch.manual_seed(0)  # same initial weights on every process
    model = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = DataLoader(make_data(1024, seed=1), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    accelerator.init_trackers(args.run_name, config=vars(args) | {"num_processes": accelerator.num_processes})
    step = 0
    for epoch in range(args.epochs):
        for x, y in progress_bar(loader, desc=f"epoch {epoch}"):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            # The mean over processes, so the logged curve is the whole batch's loss, not rank 0's.
            mean_loss = accelerator.reduce(loss.detach(), reduction="mean")
            accelerator.log({"loss": mean_loss.item(), "epoch": epoch}, step=step)
            step += 1
    accelerator.end_training()

    if accelerator.is_main_process:
        run_dir = Path(args.project_dir) / args.run_name
        png = plot_metrics(run_dir, keys=["loss"], out_png=run_dir / "loss.png", log_y=True)
        accelerator.print(f"{step} steps logged; loss curve: {png}")


if __name__ == "__main__":
    main()
