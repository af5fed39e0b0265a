"""Per-process bytes of a Llama-style model on the job's mesh, against the same model on one process.

For each layout (TP2 x FSDP2, HSDP 2 x 2, TP2 x DDP2, TP4, FSDP4) the Accelerator prepares the
model and AdamW, runs one step, and each process counts the bytes of the tensors it holds:
parameters, gradients (before ``zero_grad``) and optimizer state (the local pieces of DTensors).
The largest count over the processes is compared with the one-process run (every process builds
that one locally), and TP2 x FSDP2 also with the same model split by hand with torch's
``parallelize_module`` + ``fully_shard`` (raw torch).

    ACCEL_USE_CPU=true uv run python -m torch.distributed.run --nproc_per_node 4 bench/parallel_memory.py \
        [--dim 128 --depth 4]
"""

from __future__ import annotations

import argparse
import warnings
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.w1, self.w3 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(dim, 4 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    _no_split_modules: ClassVar[list[str]] = ["Block"]
    tp_plan: ClassVar[dict[str, str]] = {
        "tok_embeddings": "colwise_rep",
        "layers.*.attention.w[qkv]": "colwise",
        "layers.*.attention.wo": "rowwise",
        "layers.*.w[13]": "colwise",
        "layers.*.w2": "rowwise",
        "output": "colwise_rep",
    }

    def __init__(self, vocab: int, dim: int, heads: int, depth: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    tensors = params + [p.grad for p in params if p.grad is not None] + state
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


def one_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, backward) -> int:
    logits = model(tokens[:, :-1])
    backward(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)))
    optimizer.step()
    return held_bytes(model, optimizer)  # gradients still there: zero_grad comes after


def largest(value: int) -> int:
    tensor = torch.tensor([float(value)])
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    from accel import Accelerator, ParallelismConfig

    def build() -> Llama:
        torch.manual_seed(0)
        return Llama(args.vocab, args.dim, args.heads, args.depth)

    tokens = torch.randint(0, args.vocab, (8, 17), generator=torch.Generator().manual_seed(1))
    alone = build()
    alone_optimizer = torch.optim.AdamW(alone.parameters())
    reference = one_step(alone, alone_optimizer, tokens, lambda loss: loss.backward())
    layouts = {
        "TP2xFSDP2": ParallelismConfig(dp_shard_size=2, tp_size=2),
        "HSDP2x2": ParallelismConfig(dp_replicate_size=2, dp_shard_size=2),
        "TP2xDDP2": ParallelismConfig(dp_replicate_size=2, tp_size=2),
        "TP4": ParallelismConfig(tp_size=4),
        "FSDP4": ParallelismConfig(dp_shard_size=4),
    }
    rows = []
    for name, config in layouts.items():
        accelerator = Accelerator(parallelism_config=config)
        model = build()
        optimizer = torch.optim.AdamW(model.parameters())
        model, optimizer = accelerator.prepare(model, optimizer)
        dp = accelerator.parallel_dims.dp
        share = tokens.chunk(dp.size)[dp.rank]
        rows.append((name, largest(one_step(model, optimizer, share, accelerator.backward))))
        accelerator.free_memory()

    # Raw torch: the same TP2 x FSDP2 by hand.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    model = build()
    plan = {
        "tok_embeddings": ColwiseParallel(output_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }
    for i in range(args.depth):
        plan.update({f"layers.{i}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")})
        plan.update({f"layers.{i}.{w}": ColwiseParallel() for w in ("w1", "w3")})
        plan.update({f"layers.{i}.attention.wo": RowwiseParallel(), f"layers.{i}.w2": RowwiseParallel()})
    parallelize_module(model, mesh["tp"], plan)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    optimizer = torch.optim.AdamW(model.parameters())
    share = tokens.chunk(2)[mesh["dp_shard"].get_local_rank()]
    raw = largest(one_step(model, optimizer, share, lambda loss: loss.backward()))

    if dist.get_rank() == 0:
        print(f"one process: {reference} bytes (parameters + gradients + AdamW state)")
        for name, value in rows:
            print(f"{name:10s} largest per process: {value:9d} bytes = {value / reference:.3f} of one process")
        tp_fsdp = dict(rows)["TP2xFSDP2"]
        print(f"raw torch TP2xFSDP2: {raw} bytes; accel / raw = {tp_fsdp / raw:.3f}")


if __name__ == "__main__":
    main()
