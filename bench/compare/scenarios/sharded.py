"""FSDP2 / ZeRO-3 on 2 processes: bytes each process holds in the middle of an accumulation (every live CPU tensor
created since before the model was built) as a fraction of the unsharded parameters + gradients + AdamW moments
(4 x the parameters), and the median step time.

The strategy comes from the worker's `--arg strategy=fsdp2|zero3`. A framework that runs but does not
shard (falls back to data parallel on CPU) keeps every parameter whole (`param_fraction` 1.0); one that refuses
raises, and the runner notes it.
"""

from __future__ import annotations

import gc
import statistics
import time
from types import SimpleNamespace

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def _live_tensor_bytes() -> int:
    """Bytes of every live CPU tensor storage, each counted once: parameters, gradients, optimizer state and the
    strategy's own buffers (FSDP's unsharded gradients during accumulation, ZeRO's flat partitions) alike."""
    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            try:  # FSDP2 frees the unsharded parameters' storages (resized to 0): those hold nothing
                storage = obj.untyped_storage()
                size, pointer = storage.nbytes(), storage.data_ptr()
            except (RuntimeError, NotImplementedError):
                continue
            if size:
                storages[pointer] = max(storages.get(pointer, 0), size)
    return sum(storages.values())


def _local_numel(p: torch.Tensor) -> int:
    """Elements of a parameter this process stores: FSDP2's DTensor shard, ZeRO-3's partition, FSDP1's flat shard."""
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor.numel()
    return p.to_local().numel() if hasattr(p, "to_local") else p.numel()


def run(harness, quick: bool = False, **_: str) -> dict:
    dim, depth, steps = (64, 2, 6) if quick else (256, 4, 20)
    baseline = _live_tensor_bytes()
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(dim) for _ in range(depth)])
    model.config = SimpleNamespace(hidden_size=dim)  # what ZeRO-3's "auto" bucket sizes are derived from
    numel = sum(p.numel() for p in model.parameters())
    full = sum(p.numel() * p.element_size() for p in model.parameters()) * 4  # params + grads + 2 Adam moments
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, _ = harness.prepare(model, optimizer)
    torch.manual_seed(harness.rank)
    x, y = torch.randn(32, dim), torch.randn(32, dim)
    for _ in range(4):  # warm-up: two optimizer steps (accumulation 2)
        harness.train_step(model, optimizer, None, x, y)
    harness.train_step(model, optimizer, None, x, y)  # an accumulating micro-step: gradients are held now
    held = _live_tensor_bytes() - baseline
    local = sum(_local_numel(p) for p in model.parameters())
    harness.train_step(model, optimizer, None, x, y)
    times = []
    for _ in range(3):
        harness.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            harness.train_step(model, optimizer, None, x, y)
        times.append((time.perf_counter() - start) / steps * 1e3)
    return {
        "memory_fraction": held / full,
        "held_mb": held / 1e6,
        "step_ms": statistics.median(times),
        "param_fraction": local / numel,
    }
