"""fp8 against bf16 training steps on one GPU: step time and loss, for each fp8 backend installed.

The same MLP stack (wide enough for fp8 GEMMs to pay: ``--dim 4096``) trains ``--steps`` steps on the same
synthetic regression data with ``Accelerator(mixed_precision="bf16")`` and with ``mixed_precision="fp8"`` on
torchao (tensorwise and rowwise recipes) and, when installed, Transformer-Engine. Printed per run: the
median step time after warm-up, the ratio to bf16 (below 1.0 is faster), the final loss and the largest
relative loss difference from bf16 over all steps. A Hopper (H100/H200) or Ada GPU runs fp8 for real; an
older GPU falls back to fp16 (the script says so), and ``--cpu`` checks the script itself on a CPU.

    uv run python bench/fp8_step.py                       # a CUDA GPU of compute capability >= 8.9
    uv run python bench/fp8_step.py --cpu --dim 256 --steps 10
    uv run python bench/fp8_step.py --compile             # torch.compile each run (fp8's speed needs it)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    """``depth`` pre-norm residual MLP blocks of width ``dim`` (4x hidden), a head, and an input projection."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            for _ in range(depth)
        )
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def module_name(module: nn.Module) -> str:
    """``module``'s class as its package and name: ``torchao.Float8Linear``, ``transformer_engine.Linear``."""
    return f"{type(module).__module__.split('.')[0]}.{type(module).__qualname__}"


def run(name: str, precision: str, handlers: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    from accel import Accelerator

    accelerator = Accelerator(
        mixed_precision=precision,
        cpu=args.cpu,
        kwargs_handlers=handlers,
        dynamo_backend="inductor" if args.compile else "no",
    )
    torch.manual_seed(0)
    model = MLP(args.dim, args.depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    if accelerator.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    generator = torch.Generator().manual_seed(1)
    target = (torch.randn(args.dim, args.dim, generator=generator) / args.dim**0.5).to(accelerator.device)
    times, losses = [], []
    for _ in range(args.steps):
        # Targets on the device: x @ target is 275 GFLOP per step at the default size, untimed but within the
        # GPU lane's 10 minutes (bench/gpu_lane.py runs this function twice per fp8 case).
        x = torch.randn(args.batch, args.dim, generator=generator).to(accelerator.device)
        y = torch.tanh(x @ target)
        synchronize(accelerator.device)
        start = time.perf_counter()
        loss = nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        synchronize(accelerator.device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    report = getattr(accelerator.precision, "report", None)
    result = {
        "name": name,
        "mode": accelerator.mixed_precision,
        "step": statistics.median(times[args.warmup :]),
        "losses": losses,
        "converted": len(report.converted) if report is not None else 0,
        "layers": list(report.converted) if report is not None else [],  # as accel reports them
        "classes": {fqn: module_name(accelerator.unwrap_model(model).get_submodule(fqn)) for fqn in report.converted}
        if report is not None
        else {},  # what those layers are now: the backend's modules
        "peak_mib": torch.cuda.max_memory_allocated(accelerator.device) / 2**20
        if accelerator.device.type == "cuda"
        else None,
    }
    accelerator.free_memory()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8192, help="rows per step (tokens)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="check the script on a CPU (torchao only)")
    args = parser.parse_args()
    if args.cpu:
        args.batch = min(args.batch, 256)
    args.warmup = min(args.warmup, args.steps - 1)

    from accel.utils import AORecipeKwargs, is_transformer_engine_available

    if torch.cuda.is_available() and not args.cpu:
        print(f"device: {torch.cuda.get_device_name()} (compute capability {torch.cuda.get_device_capability()})")
    runs = [run("bf16", "bf16", [], args)]
    for recipe in ("tensorwise", "rowwise"):
        runs.append(run(f"fp8 torchao {recipe}", "fp8", [AORecipeKwargs(recipe_name=recipe)], args))
    if is_transformer_engine_available() and torch.cuda.is_available() and not args.cpu:
        from accel.utils import TERecipeKwargs

        runs.append(run("fp8 transformer-engine", "fp8", [TERecipeKwargs()], args))
    base = runs[0]
    print(f"dim={args.dim} depth={args.depth} batch={args.batch} steps={args.steps} compile={args.compile}")
    print(
        f"{'run':<26} {'mode':<5} {'fp8 layers':>10} {'step ms':>9} {'/ bf16':>7} {'final loss':>11} "
        f"{'max rel dloss':>14}"
    )
    for r in runs:
        worst = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base["losses"], strict=True))
        print(
            f"{r['name']:<26} {r['mode']:<5} {r['converted']:>10} {1000 * r['step']:>9.2f} "
            f"{r['step'] / base['step']:>7.3f} {r['losses'][-1]:>11.5f} {worst:>14.4f}"
        )
        if r["name"].startswith("fp8") and r["mode"] != "fp8":
            print(f"  (this GPU cannot run fp8: it fell back to {r['mode']})")


if __name__ == "__main__":
    main()
