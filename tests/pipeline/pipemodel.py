"""A small transformer for the pipeline tests and bench: embedding, a ModuleList of pre-norm blocks (causal
attention + MLP), a final norm and a head, with a forward that calls its units as a chain (what pipeline
splitting needs). Imported by the launched scripts, not collected by pytest."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, DIM, HEADS, SEQ = 64, 32, 4, 8


class Block(nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.heads = HEADS
        self.norm1 = nn.LayerNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        # -1 heads: under tensor parallelism each process holds HEADS / tp of them.
        q, k, v = (w(h).view(b, s, -1, d // self.heads).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class PipeLM(nn.Module):
    _no_split_modules: ClassVar[list[str]] = ["Block"]
    tp_plan: ClassVar[dict[str, str]] = {
        "layers.*.wq": "colwise",
        "layers.*.wk": "colwise",
        "layers.*.wv": "colwise",
        "layers.*.proj": "rowwise",
        "layers.*.up": "colwise",
        "layers.*.down": "rowwise",
    }

    def __init__(self, depth: int = 4, dim: int = DIM) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def make_model(seed: int = 0, depth: int = 4, dim: int = DIM) -> PipeLM:
    torch.manual_seed(seed)
    return PipeLM(depth, dim)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy (mean over every token of the batch)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def token_data(samples: int, seed: int = 123) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (samples, SEQ + 1), generator=g)
