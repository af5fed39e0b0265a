"""One small training run with a plain ``Accelerator()``, the same whichever engine starts its processes.

Usage: ``cluster_train.py <out_dir> [--deepspeed]`` under ``srun``, ``mpirun``, ``accel launch`` (or, through
``train``, from another launcher's worker function). Each rank writes ``<out_dir>/rank<N>.json``: what started it (the
launcher ``accel_core.cluster_env`` detects before the ``Accelerator`` exists, and whether a process group existed
already), the world it joined and how (the init method torch.distributed was given), the ranks an all_gather returned,
its host, the environment variables ``Accelerator()`` changed (none: it settles the launcher's variables into its own
record), its losses and a digest of its final weights; rank 0 also writes the initial and final weights
(``initial.safetensors``, ``final.safetensors``). The numbers depend on the world only (2 processes, seeded data and
model, DDP over gloo), so every engine's final weights must equal an ``accel launch --cpu -n 2`` run's, bit for bit.

``--deepspeed``: the same training with DeepSpeed ZeRO-2 (``DeepSpeedPlugin(zero_stage=2)``): the report adds the
engine's ZeRO stage and its optimizer's class; its numbers are the DDP run's up to float rounding (ZeRO reduces and
steps flat partitions of the gradients).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import socket
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel_core import cluster_env

EPOCHS = 2


def changed_variables(before: dict[str, str]) -> list[str]:
    """The names of the variables set, changed or removed in ``os.environ`` since ``before``."""
    return sorted(name for name in {*before, *os.environ} if before.get(name) != os.environ.get(name))


def train(out_dir: str | Path, deepspeed: bool = False) -> None:
    out = Path(out_dir)
    started_by = cluster_env.detect()
    group_before = torch.distributed.is_available() and torch.distributed.is_initialized()
    environ_before = dict(os.environ)
    import_changed: list[str] = []
    if deepspeed:
        from accel import DeepSpeedPlugin

        # Importing DeepSpeed sets variables of its own (PYTORCH_NVML_BASED_CUDA_CHECK), whoever imports it: imported
        # first, so that what Accelerator() writes is told apart.
        importlib.import_module("deepspeed")
        import_changed = changed_variables(environ_before)
        environ_before = dict(os.environ)
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    else:
        accelerator = Accelerator()
    # The Accelerator settles the launcher's variables into its own record: os.environ is left as it was.
    environ_changed = changed_variables(environ_before)

    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    targets = (data @ torch.randn(8, 1, generator=torch.Generator().manual_seed(2))).squeeze(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(data, targets), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    steps = 0
    losses: list[float] = []
    for _ in range(EPOCHS):
        for inputs, labels in loader:
            loss = torch.nn.functional.mse_loss(model(inputs).squeeze(1), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            losses.append(loss.item())

    gathered = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
    final = accelerator.unwrap_model(model).state_dict()
    digest = hashlib.sha256()
    for name, tensor in final.items():
        digest.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
    report = {
        "launcher": started_by.launcher if started_by else None,
        "group_before": group_before,
        "world_size": accelerator.num_processes,
        "rank": accelerator.process_index,
        "local_rank": accelerator.local_process_index,
        "distributed_type": str(accelerator.distributed_type),
        "gathered_ranks": gathered,
        "host": socket.gethostname(),
        "master_addr": accelerator.state.settings.master_addr,  # where the settled record says rank 0 is
        "environ_changed": environ_changed,
        "deepspeed_import_changed": import_changed,
        "local_rank_variable": os.environ.get("LOCAL_RANK"),
        # What torch.distributed was handed to join (None: a group it did not start here, e.g. Ray's).
        "init_method": torch.distributed.distributed_c10d._default_pg_init_method,
        "steps": steps,
        "losses": losses,
        "weights_sha256": digest.hexdigest(),
    }
    if deepspeed:  # what the engine really runs: its ZeRO stage and the optimizer ZeRO wrapped AdamW in
        report["zero_stage"] = model.zero_optimization_stage()
        report["zero_optimizer"] = type(model.optimizer).__name__
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(report))
    if accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in initial.items()}, str(out / "initial.safetensors"))
        save_file({k: v.detach().contiguous() for k, v in final.items()}, str(out / "final.safetensors"))
    accelerator.end_training()


if __name__ == "__main__":
    train(sys.argv[1], deepspeed="--deepspeed" in sys.argv[2:])
