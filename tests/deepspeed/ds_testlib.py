"""Helpers shared by the DeepSpeed check scripts: data, models, and the references DeepSpeed must match.

References are computed in the same processes, on the very batches the prepared dataloader gave
each rank: plain torch DDP (the trajectory to follow) and one process training on the whole
global batch (the weights a single process would have).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

FEATURES, HIDDEN, SAMPLES, BATCH = 8, 32, 64, 4
LR = 1e-2


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def close(a: list[float], b: list[float], rtol: float, atol: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= atol + rtol * abs(y) for x, y in zip(a, b, strict=True))


def regression_data(seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = 3.0 * torch.sin(x).sum(dim=1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, 1),
    )


class TokenClassifier(torch.nn.Module):
    """Integer inputs, so the same loop feeds an fp32 model and DeepSpeed's bf16 one."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(50, HIDDEN)
        self.head = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 5))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens).mean(dim=1))


def token_data(seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (SAMPLES, 6), generator=g)
    labels = tokens[:, 0] % 5
    return torch.utils.data.TensorDataset(tokens, labels)


def regression_loss(model: Any, batch: Any) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x).float(), y)


def token_loss(model: Any, batch: Any) -> torch.Tensor:
    tokens, labels = batch
    return F.cross_entropy(model(tokens).float(), labels)


def train_accel(
    accelerator: Any,
    model: Any,
    optimizer: Any,
    loader: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] = regression_loss,
    scheduler: Any = None,
    clip: float | None = None,
    max_batches: int | None = None,
) -> tuple[list[float], list[Any]]:
    """The unchanged user loop. Returns the loss of every micro-step (mean over ranks) and this rank's batches."""
    losses, batches = [], []
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        batches.append([t.clone() for t in batch])
        with accelerator.accumulate(model):
            loss = loss_fn(model, batch)
            accelerator.backward(loss)
            if clip is not None and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.detach().float())
    return mean_over_ranks(losses), batches


def mean_over_ranks(losses: list[torch.Tensor]) -> list[float]:
    stacked = torch.stack(losses)
    dist.all_reduce(stacked)
    return (stacked / dist.get_world_size()).tolist()


def train_ddp(
    make_model: Callable[[], torch.nn.Module],
    batches: list[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] = regression_loss,
    accumulation: int = 1,
    clip: float | None = None,
    make_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
) -> tuple[list[float], list[float], torch.nn.Module]:
    """Plain torch DDP on this rank's batches: (losses per micro-step, gradient norms, trained module)."""
    model = make_model()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=LR)
    scheduler = make_scheduler(optimizer) if make_scheduler is not None else None
    losses, norms = [], []
    for i, batch in enumerate(batches):
        boundary = (i + 1) % accumulation == 0 or i == len(batches) - 1
        with contextlib.nullcontext() if boundary else ddp.no_sync():
            loss = loss_fn(ddp, batch)
            (loss / accumulation).backward()
        if boundary:
            if clip is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip)))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.detach())
    return mean_over_ranks(losses), norms, model


def train_single_process(
    make_model: Callable[[], torch.nn.Module],
    batches: list[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor] = regression_loss,
) -> torch.nn.Module:
    """One process on the global batch of every step (all ranks' batches, gathered): the weights to expect."""
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, batches)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(len(batches)):
        parts = [ranks_batches[step] for ranks_batches in everyone]
        batch = [torch.cat([part[k] for part in parts]) for k in range(len(parts[0]))]
        loss_fn(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def extensions_dir_note() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")
