"""A small causal transformer trained with `accelerator.forward_backward`: the same script on every layout.

    accel launch --cpu -n 2 examples/train_pipeline.py                     # DDP
    accel launch --cpu -n 2 --use-fsdp examples/train_pipeline.py          # FSDP2
    accel launch --cpu -n 2 --pp-size 2 examples/train_pipeline.py         # two pipeline stages (1F1B)
    accel launch --cpu -n 2 --pp-size 2 --pp-schedule gpipe --pp-microbatches 4 examples/train_pipeline.py

The task: sequences counting up from a random start (modulo the vocabulary); the model learns to
predict each next token. The model's forward calls its units as a chain (embedding, blocks, norm,
head), which is what splitting it into pipeline stages needs. Prints the loss every 20 steps and
the next-token accuracy on held-out sequences, gathered with `gather_for_metrics`.
"""

from __future__ import annotations

import argparse
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator

VOCAB, DIM, SEQ = 32, 64, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attention = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class CountingLM(nn.Module):
    _no_split_modules: ClassVar[list[str]] = ["Block"]

    def __init__(self, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(depth))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def sequences(count: int, seed: int) -> torch.Tensor:
    start = torch.randint(0, VOCAB, (count, 1), generator=torch.Generator().manual_seed(seed))
    return (start + torch.arange(SEQ + 1)) % VOCAB


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    args = parser.parse_args()

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = CountingLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = DataLoader(TensorDataset(sequences(args.steps * args.batch_size, 0)), args.batch_size, shuffle=True)
    test = DataLoader(TensorDataset(sequences(64, 1)), batch_size=8)
    model, optimizer, train, test = accelerator.prepare(model, optimizer, train, test)

    model.train()
    for step, (batch,) in enumerate(train):
        loss = accelerator.forward_backward(model, batch[:, :-1], batch[:, 1:], loss_fn)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0 or step == len(train) - 1:
            accelerator.print(f"step {step}: loss {loss.item():.4f}")

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for (batch,) in test:
            predictions = accelerator.gather_for_metrics(model(batch[:, :-1]).argmax(-1))
            targets = accelerator.gather_for_metrics(batch[:, 1:])
            correct += int((predictions == targets).sum())
            total += targets.numel()
    accuracy = correct / total
    accelerator.print(
        f"accuracy {accuracy:.3f} on {total // SEQ} sequences ({accelerator.parallelism_config.describe()})"
    )
    if accuracy < args.min_accuracy:
        raise SystemExit(f"accuracy {accuracy:.3f} < {args.min_accuracy}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
