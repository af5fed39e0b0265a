"""accel-fsdp: per-process memory of FSDP2 against DDP, and step time against a hand-written
``fully_shard`` loop, measured side by side in one run.

1. Bytes each process holds after a training step of the same model with AdamW: parameters,
   gradients and optimizer state (the tensors themselves, counted exactly; DDP's reducer also keeps
   gradient buckets, reported apart), for plain DDP and for accel's fsdp strategy (FSDP2).
2. Median time of one training step (forward, backward, optimizer step, zero_grad) through the
   Accelerator against the same model sharded by hand with ``fully_shard`` (same units, same data),
   rounds interleaved (alternating which goes first) so that a change in machine load hits both alike.

    uv run python -m torch.distributed.run --nproc_per_node 2 bench/fsdp_memory.py \
        [--dim 256 --depth 4 --steps 20 --rounds 3]

On the CPU (gloo) set ACCEL_USE_CPU=true; on GPUs it uses NCCL and one GPU per process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def nbytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def breakdown(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    states = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "parameters": nbytes(model.parameters()),
        "gradients": nbytes(p.grad for p in model.parameters()),
        "optimizer state": nbytes(states),
    }


def step(model: nn.Module, optimizer, x: torch.Tensor, y: torch.Tensor, backward=None) -> None:
    loss = nn.functional.mse_loss(model(x), y)
    (backward or torch.Tensor.backward)(loss)
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="samples per process and step")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from accel_core import Accelerator
    from accel_fsdp import FullyShardedDataParallelPlugin

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"]))
    rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.dim, device=device)
    y = torch.randn(args.batch, args.dim, device=device)

    def fresh() -> Net:
        torch.manual_seed(0)
        return Net(args.dim, args.depth).to(device)

    # -- 1. memory ------------------------------------------------------------------------------
    from torch.nn.parallel import DistributedDataParallel

    ddp_model = fresh()
    ddp = DistributedDataParallel(ddp_model, device_ids=[device.index] if device.type == "cuda" else None)
    ddp_opt = torch.optim.AdamW(ddp_model.parameters(), lr=1e-3)
    step(ddp, ddp_opt, x, y)
    ddp_model(x).sum().backward()  # gradients present, as during a step
    ddp_bytes = breakdown(ddp_model, ddp_opt)
    bucket_bytes = nbytes(bucket.buffer() for bucket in _ddp_buckets(ddp))

    model = fresh()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    step(model, optimizer, x, y, accelerator.backward)
    model(x).sum().backward()
    fsdp_bytes = breakdown(model, optimizer.optimizer)
    optimizer.zero_grad()
    del ddp, ddp_model, ddp_opt

    # -- 2. step time: accel against a hand-written fully_shard loop ------------------------------
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    manual = fresh()
    mesh = init_device_mesh(device.type, (world,))
    for block in manual.blocks:  # the same units and settings as the strategy's defaults
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(manual, mesh=mesh, reshard_after_forward=True)
    manual_opt = torch.optim.AdamW(manual.parameters(), lr=1e-3)

    def timed(run) -> float:
        for _ in range(2):  # warm-up
            run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / args.steps

    accel_times, manual_times = [], []
    for round_index in range(args.rounds):
        # Alternate which goes first, so that warm caches or a load change do not favour one side.
        runs = [
            (accel_times, lambda: step(model, optimizer, x, y, accelerator.backward)),
            (manual_times, lambda: step(manual, manual_opt, x, y)),
        ]
        for times, run in runs if round_index % 2 == 0 else runs[::-1]:
            times.append(timed(run))

    report = {
        "ddp": ddp_bytes,
        "fsdp": fsdp_bytes,
        "buckets": bucket_bytes,
        "accel": accel_times,
        "manual": manual_times,
    }
    reports = [None] * world
    dist.all_gather_object(reports, report)
    if rank == 0:
        params = sum(p.numel() for p in fresh().parameters())
        print(f"model: {params / 1e6:.2f} M parameters (fp32), {world} processes on {device.type}, AdamW\n")
        print(f"{'per process, bytes':<24}{'DDP':>14}{'FSDP2 (accel)':>16}{'ratio':>8}")
        for i, r in enumerate(reports):
            total_ddp = total_fsdp = 0
            for key in ("parameters", "gradients", "optimizer state"):
                a, b = r["ddp"][key], r["fsdp"][key]
                total_ddp, total_fsdp = total_ddp + a, total_fsdp + b
                print(f"  rank {i} {key:<16}{a:>14,}{b:>16,}{b / a:>8.3f}")
            print(f"  rank {i} {'total':<16}{total_ddp:>14,}{total_fsdp:>16,}{total_fsdp / total_ddp:>8.3f}")
            print(f"  rank {i} DDP reducer buckets (extra gradient copy): {r['buckets']:,}")
        accel = statistics.median(t for r in reports for t in r["accel"])
        manual = statistics.median(t for r in reports for t in r["manual"])
        # Paired ratios (same round, same rank): the two sides ran back to back under the same load.
        paired = [a / m for r in reports for a, m in zip(r["accel"], r["manual"], strict=True)]
        print(f"\nstep time (median over {args.rounds} rounds x {args.steps} steps, all ranks):")
        print(f"  accel fsdp strategy      {accel * 1e3:8.2f} ms")
        print(f"  hand-written fully_shard {manual * 1e3:8.2f} ms")
        print(
            f"  ratio accel / hand-written: {accel / manual:.3f} (median of paired rounds "
            f"{statistics.median(paired):.3f}, range {min(paired):.3f}-{max(paired):.3f})"
        )
    dist.barrier()
    dist.destroy_process_group()


def _ddp_buckets(ddp) -> list:
    """The reducer's gradient buckets (an extra gradient-sized buffer unless gradient_as_bucket_view)."""
    try:
        return list(ddp.reducer._get_zeros_like_grad_buckets())
    except Exception:  # noqa: BLE001 - a private API; the bench still reports the rest
        return []


if __name__ == "__main__":
    main()
