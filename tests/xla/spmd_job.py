"""SPMD checks on XLA's CPU device with 4 virtual devices, in a process of their own (SPMD mode, once on, stays on
for the whole process). Run by test_xla_spmd.py; prints one JSON line of figures, which the test asserts on.

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 python tests/xla/spmd_job.py <folder for checkpoints>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from accel import Accelerator
from accel_core.parallel.config import ParallelismConfig
from accel_core.state import AcceleratorState, GradientState
from accel_xla.spmd import sharding_of

STEPS = 10
BATCH = 8
TP_PLAN = {"0": "colwise", "2": "rowwise"}


def make_job(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * BATCH, 6, generator=generator)
    y = torch.stack([x[:, :3].sum(1), x[:, 3:].sum(1), x[:, 0], -x[:, 1]], dim=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    return model, optimizer, loader


def plain_cpu_losses(clip: float | None, accumulation: int) -> list[float]:
    model, optimizer, loader = make_job()
    losses = []
    for i, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        (loss / accumulation).backward()
        if (i + 1) % accumulation == 0:
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def fresh() -> None:
    """Forgets the process state, as a new process would start (several Accelerators in one process)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def train(accelerator: Accelerator, clip: float | None) -> tuple[list[float], Any, Any, dict[str, str]]:
    model, optimizer, loader = accelerator.prepare(*make_job())
    losses, batch_shardings = [], {}
    for x, y in loader:
        batch_shardings = {"x": sharding_of(x), "y": sharding_of(y)}
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            if clip is not None and accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model, optimizer, batch_shardings


def shardings(accelerator: Accelerator, model: Any) -> dict[str, Any]:
    spmd = accelerator.strategy.spmd
    inner = accelerator.unwrap_model(model)
    return {name: {"spec": list(spmd.spec_of(p)), "xla": sharding_of(p)} for name, p in inner.named_parameters()}


def run_layout(config: ParallelismConfig, clip: float | None, accumulation: int = 1) -> dict[str, Any]:
    fresh()
    accelerator = Accelerator(parallelism_config=config, gradient_accumulation_steps=accumulation)
    losses, model, _, batch = train(accelerator, clip)
    layout = accelerator.strategy.spmd.layout
    return {
        "losses": losses,
        "reference": plain_cpu_losses(clip, accumulation),
        "params": shardings(accelerator, model),
        "batch": batch,
        "wrapped": type(model).__name__,
        "process_layout": accelerator.parallel_dims.config.sizes,
        "device_layout": layout.sizes,
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
    }


def checkpoint(folder: Path) -> dict[str, Any]:
    config = ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan=TP_PLAN)
    fresh()
    accelerator = Accelerator(parallelism_config=config)
    _, model, optimizer, _ = train(accelerator, None)
    saved = accelerator.save_state(str(folder / "ckpt"))
    weights = {k: v.cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    exp_avg = optimizer.state_dict()["state"][0]["exp_avg"].cpu().clone()
    draw_after_save = torch.rand(4, device=accelerator.device).cpu()
    on_disk = torch.load(Path(saved) / "sharded" / "model_0.bin", weights_only=True)
    accelerator.save_model(model, str(folder / "export"))
    from safetensors.torch import load_file

    exported = load_file(str(next((folder / "export").glob("*.safetensors"))))

    fresh()
    accelerator = Accelerator(parallelism_config=config)
    model, optimizer, _ = accelerator.prepare(*make_job(seed=5))
    accelerator.load_state(saved)
    loaded = accelerator.unwrap_model(model)
    state = optimizer.state[loaded[0].weight]
    return {
        "files": sorted(p.name for p in (Path(saved) / "sharded").iterdir()),
        "on_disk_shapes": {k: list(v.shape) for k, v in on_disk.items()},
        "on_disk_equal": all(torch.equal(on_disk[k], weights[k]) for k in weights),
        "exported_equal": sorted(exported) == sorted(weights)
        and all(torch.equal(exported[k], weights[k]) for k in weights),
        "loaded_equal": all(torch.equal(v.cpu(), weights[k]) for k, v in loaded.state_dict().items()),
        "loaded_sharding": sharding_of(loaded[0].weight),
        "exp_avg_equal": torch.equal(state["exp_avg"].cpu(), exp_avg),
        "exp_avg_sharding": sharding_of(state["exp_avg"]),
        "rng_restored": torch.equal(torch.rand(4, device=accelerator.device).cpu(), draw_after_save),
    }


def main() -> None:
    folder = Path(sys.argv[1])
    results = {
        "dp_shard": run_layout(ParallelismConfig(dp_shard_size=4), clip=0.5, accumulation=2),
        "dp_shard_tp": run_layout(ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan=TP_PLAN), clip=None),
        "checkpoint": checkpoint(folder),
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
