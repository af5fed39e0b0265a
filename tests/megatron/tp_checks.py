"""Megatron-core TP + DP through the Accelerator, against plain torch, in one 2-process gloo launch.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/megatron/tp_checks.py <tmp_dir>
Checks, in order: refused settings (the distributed optimizer, tp_degree=3 on 2 processes, sequence parallelism
and bf16 on CPU) fail on every process; TP=2 training (AdamW, clipping) follows one process
training the unsplit model; Megatron's RNG streams; full-weight export; save_state / load_state
replays the same steps; DP=2 with the plugin's gradient_clipping and accumulation follows torch
DDP; a TP=2 checkpoint refuses to load under TP=1; free_memory() forgets the run's state (the strategy's teardown,
on one process alone) and the Accelerator prepares anew.
Each ``@check`` is one test of test_megatron_runs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from checklist import check, expect, run_checks
from megatron_checklib import raises, rank
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from accel_checkpoint.errors import CheckpointMismatchError
from accel_core import Accelerator, DistributedType
from accel_megatron import MegatronLMPlugin

TMP = Path(sys.argv[1])
FEATURES, HIDDEN, OUT, SAMPLES, BATCH, LR, CLIP = 8, 16, 4, 48, 4, 1e-2, 0.3


def close(a: torch.Tensor | float, b: torch.Tensor | float, tol: float = 1e-5) -> bool:
    return torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float(), rtol=tol, atol=tol)


class TPMLP(nn.Module):
    """col (split by output) -> tanh -> dropout on the split hidden (Megatron's TP RNG stream) -> row (split by
    input)."""

    def __init__(self, config) -> None:
        super().__init__()
        from megatron.core import tensor_parallel

        init = nn.init.xavier_normal_
        self.col = tensor_parallel.ColumnParallelLinear(
            FEATURES, HIDDEN, config=config, init_method=init, bias=True, gather_output=False
        )
        self.row = tensor_parallel.RowParallelLinear(
            HIDDEN, OUT, config=config, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False
        )
        self.dropout = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        hidden = torch.tanh(self.col(x)[0])
        with get_cuda_rng_tracker().fork():
            hidden = F.dropout(hidden, self.dropout, self.training)
        return self.row(hidden)[0]


class FullMLP(nn.Module):
    """The unsplit model, with the same parameter names."""

    def __init__(self) -> None:
        super().__init__()
        self.col, self.row = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.row(torch.tanh(self.col(x)))


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    return torch.utils.data.TensorDataset(x, torch.sin(x[:, :OUT]) + 0.1 * torch.randn(SAMPLES, OUT, generator=g))


def loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(), batch_size=BATCH, shuffle=False)


def step(accelerator, model, optimizer, batch, clip: float | None = None):
    x, y = batch
    with accelerator.accumulate(model):
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        norm = (
            accelerator.clip_grad_norm_(model.parameters(), clip)
            if clip is not None and accelerator.sync_gradients
            else None
        )
        optimizer.step()
        optimizer.zero_grad()
    return loss.detach(), norm


def expect_refused_settings() -> None:
    with raises(ValueError, "use_distributed_optimizer=True): Megatron's distributed optimizer is not supported"):
        MegatronLMPlugin(use_distributed_optimizer=True)
    # Before any communication, so each process raises on its own: nobody waits for the others.
    with raises(ValueError, "tp_degree=3, pp_degree=1) does not divide the 2 processes"):
        Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=3))
    with raises(ValueError, "sequence_parallelism=True) needs GPUs"):
        Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, sequence_parallelism=True))
    with raises(ValueError, "mixed_precision='bf16' with the megatron strategy needs GPUs"):
        Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2), mixed_precision="bf16")


def expect_tensor_parallel() -> tuple[Accelerator, nn.Module, torch.optim.Optimizer]:
    """(a) TP=2 follows the unsplit model: losses, clipping norms, final gathered weights."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(tp_degree=2))
    strategy = accelerator.strategy
    expect(
        accelerator.distributed_type == DistributedType.MEGATRON_LM, f"distributed_type {accelerator.distributed_type}"
    )
    expect(
        parallel_state.get_tensor_model_parallel_rank() == rank(),
        "TP rank = process index with tp_degree=2 on 2 processes",
    )
    dims = accelerator.parallel_dims
    expect((dims.dp.size, dims.dp.rank, dims.tp.size) == (1, 0, 2), "TP peers form one DP replica on the job's mesh")
    expect(accelerator.state.megatron_lm_plugin is strategy.plugin, "state.megatron_lm_plugin is the plugin")

    # Megatron's RNG streams: inside fork() TP ranks draw differently, outside they agree, and fork leaves the default
    # stream alone.
    torch.manual_seed(7)
    with get_cuda_rng_tracker().fork():
        inside = torch.rand(4)
    outside = torch.rand(4)
    torch.manual_seed(7)
    expect(torch.equal(outside, torch.rand(4)), "fork() must not consume the default stream")
    draws = [torch.empty(8) for _ in range(2)]
    dist.all_gather(draws, torch.cat([inside, outside]))
    expect(
        not torch.equal(draws[0][:4], draws[1][:4]) and torch.equal(draws[0][4:], draws[1][4:]),
        f"RNG streams per TP rank: {draws}",
    )

    torch.manual_seed(0)
    reference = FullMLP()
    torch.manual_seed(1)  # other weights on purpose: load_model_state_dict must give each rank its block
    model = TPMLP(strategy.model_parallel_config())
    expect(
        model.col.weight.shape == (HIDDEN // 2, FEATURES) and model.row.weight.shape == (OUT, HIDDEN // 2),
        "weights split in two",
    )
    strategy.load_model_state_dict(model, reference.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, loader())
    expect(accelerator.unwrap_model(model) is model, "no DDP wrapper with a single DP replica")

    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
    batches = list(train_loader)
    seen = [None, None]
    dist.all_gather_object(seen, [b[0].sum().item() for b in batches])
    expect(seen[0] == seen[1] and len(batches) == SAMPLES // BATCH, "TP peers read the same batches, all of them")
    # gather_for_metrics gathers over the DP group: TP peers hold the same samples, so the world would repeat them.
    eval_x = dataset().tensors[0][:10]
    eval_loader = accelerator.prepare(
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(eval_x), batch_size=BATCH)
    )
    gathered = torch.cat([accelerator.gather_for_metrics(b[0]) for b in eval_loader])
    plugin = accelerator.state.megatron_lm_plugin
    expect(
        (plugin.micro_batch_size, plugin.data_parallel_size, plugin.global_batch_size) == (BATCH, 1, BATCH),
        "TP=2 on 2 processes: micro_batch_size = the loader's batch size, one DP replica, global = micro x 1 x 1: "
        f"{(plugin.micro_batch_size, plugin.data_parallel_size, plugin.global_batch_size)}",
    )
    expect(
        torch.equal(gathered, eval_x),
        f"gather_for_metrics under TP=2: {tuple(gathered.shape)} rows, expected the 10 samples once",
    )
    clipped = 0
    for i, batch in enumerate(batches[:6]):
        loss, norm = step(accelerator, model, optimizer, batch, clip=CLIP)
        ref_loss = F.mse_loss(reference(batch[0]), batch[1])
        ref_loss.backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        expect(close(loss, ref_loss), f"step {i}: loss {loss.item()} vs unsplit {ref_loss.item()}")
        expect(close(norm, ref_norm), f"step {i}: clip norm {norm.item()} vs unsplit {ref_norm.item()}")
        clipped += int(ref_norm > CLIP)
    expect(clipped >= 2, f"clipping must act in the test ({clipped} clipped steps)")
    full = accelerator.get_state_dict(model)
    expect(sorted(full) == sorted(reference.state_dict()), f"gathered keys {sorted(full)}")
    for key, value in reference.state_dict().items():
        expect(
            full[key].shape == value.shape and close(full[key], value),
            f"gathered {key} differs from the unsplit model's",
        )

    # Full-weight export: one safetensors file with the unsplit weights.
    accelerator.save_model(model, TMP / "export")
    if accelerator.is_main_process:
        from safetensors.torch import load_file

        exported = load_file(TMP / "export" / "model.safetensors")
        expect(
            all(torch.equal(exported[k], full[k]) for k in full) and sorted(exported) == sorted(full),
            "save_model wrote the gathered weights",
        )
    return accelerator, model, optimizer


def expect_checkpoint_replay(accelerator: Accelerator, model: nn.Module, optimizer) -> None:
    """(c) save_state, 3 more steps (with dropout on the TP stream), load_state, the same 3 steps again: identical."""
    accelerator.unwrap_model(model).dropout = 0.3
    batches = list(accelerator._dataloaders[0])[6:9]
    accelerator.save_state(TMP / "ckpt")

    def run() -> tuple[list[float], dict[str, torch.Tensor]]:
        losses = [step(accelerator, model, optimizer, batch)[0].item() for batch in batches]
        return losses, {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}

    first_losses, first_weights = run()
    accelerator.load_state(TMP / "ckpt")
    second_losses, second_weights = run()
    expect(first_losses == second_losses, f"replayed losses {second_losses} vs {first_losses}")
    expect(all(torch.equal(first_weights[k], second_weights[k]) for k in first_weights), "replayed weights differ")
    files = sorted(p.relative_to(TMP / "ckpt").as_posix() for p in (TMP / "ckpt" / "sharded").rglob("*") if p.is_file())
    expect(
        files
        == ["sharded/megatron.json"]
        + [f"sharded/tp_rank_0{r}/{n}" for r in (0, 1) for n in ("model_0.pt", "optimizer_0.pt", "rng_tracker.pt")],
        f"{files}",
    )


def expect_data_parallel() -> Accelerator:
    """(b) TP=1 on 2 processes is DP=2: follows torch DDP (accumulation 2, the plugin's gradient_clipping).
    Then (d) the TP=2 checkpoint refuses to load here."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()  # the TP=2 groups; a new plugin with other degrees needs new ones
    accelerator = Accelerator(
        megatron_lm_plugin=MegatronLMPlugin(tp_degree=1, gradient_clipping=CLIP), gradient_accumulation_steps=2
    )
    strategy = accelerator.strategy
    expect(
        (accelerator.parallel_dims.dp.size, accelerator.parallel_dims.dp.rank) == (2, rank()),
        "TP=1 on 2 processes is DP=2",
    )
    torch.manual_seed(0)
    model = FullMLP()
    torch.manual_seed(0)
    reference = DistributedDataParallel(FullMLP())
    model, optimizer, train_loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=LR), loader())
    expect(isinstance(model, DistributedDataParallel), "DP replicas are wrapped in DDP")
    plugin = accelerator.state.megatron_lm_plugin
    expect(
        (plugin.data_parallel_size, plugin.global_batch_size) == (2, 2 * BATCH),
        f"TP=1 on 2 processes: global_batch_size = 2 replicas x micro: {plugin.global_batch_size}",
    )
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
    batches = list(train_loader)[:6]
    seen = [None, None]
    dist.all_gather_object(seen, [b[0].sum().item() for b in batches])
    expect(seen[0] != seen[1], "DP ranks read different batches")
    for i, batch in enumerate(batches):
        loss, _ = step(accelerator, model, optimizer, batch)
        boundary = i % 2 == 1
        with contextlib.nullcontext() if boundary else reference.no_sync():
            ref_loss = F.mse_loss(reference(batch[0]), batch[1])
            (ref_loss / 2).backward()
        expect(close(loss, ref_loss), f"step {i}: loss {loss.item()} vs DDP {ref_loss.item()}")
        if boundary:
            ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), CLIP)
            expect(
                close(strategy.last_grad_norm, ref_norm),
                f"step {i}: plugin clip norm {strategy.last_grad_norm} vs DDP {ref_norm}",
            )
            ref_optimizer.step()
            ref_optimizer.zero_grad()
    for key, value in reference.module.state_dict().items():
        expect(close(accelerator.get_state_dict(model)[key], value), f"{key} differs from DDP's")

    with raises(CheckpointMismatchError, "saved with tp_degree=2, pp_degree=1, vp_degree=1, this run uses tp_degree=1"):
        accelerator.load_state(TMP / "ckpt")
    return accelerator


def expect_teardown(accelerator: Accelerator) -> None:
    """(e) free_memory() tears the strategy down: its run state (last clipping norm, the loaders' batch sizes, the
    plugin's batch arguments) is forgotten, a second teardown on one process alone waits for nobody, and a new
    prepare on the same Accelerator takes its batch arguments from its own loader (not the smaller one before)."""
    strategy, plugin = accelerator.strategy, accelerator.strategy.plugin
    batch_arguments = lambda: (plugin.micro_batch_size, plugin.data_parallel_size, plugin.global_batch_size)  # noqa: E731
    expect(
        strategy.last_grad_norm is not None and batch_arguments() == (BATCH, 2, 2 * BATCH),
        f"the DP run's state before free_memory: norm {strategy.last_grad_norm}, batch arguments {batch_arguments()}",
    )
    accelerator.free_memory()
    expect(
        strategy.last_grad_norm is None and batch_arguments() == (None, None, None),
        f"after free_memory: norm {strategy.last_grad_norm}, batch arguments {batch_arguments()}",
    )
    if rank() == 1:  # local: a collective here would leave this rank waiting while rank 0 prepares below
        strategy.teardown()
    torch.manual_seed(0)
    model = FullMLP()
    big_batches = torch.utils.data.DataLoader(dataset(), batch_size=2 * BATCH, shuffle=False)
    model, optimizer, train_loader = accelerator.prepare(
        model, torch.optim.AdamW(model.parameters(), lr=LR), big_batches
    )
    expect(
        batch_arguments() == (2 * BATCH, 2, 4 * BATCH),
        f"a prepare after free_memory: batch arguments {batch_arguments()}, expected those of its loader of "
        f"{2 * BATCH} alone (the loader of {BATCH} before was forgotten)",
    )
    for batch in list(train_loader)[:2]:  # one accumulation boundary: the plugin's clipping measures again
        step(accelerator, model, optimizer, batch)
    expect(strategy.last_grad_norm is not None, "the new run's clipping norm after free_memory")


RUN: dict = {}  # the TP=2 run, for the replay check after it


@check
def refused_settings_fail_on_every_process() -> None:
    expect_refused_settings()


@check
def tensor_parallel_follows_the_unsplit_model() -> None:
    RUN["accelerator"], RUN["model"], RUN["optimizer"] = expect_tensor_parallel()


@check
def save_state_load_state_replays_the_same_steps() -> None:
    expect_checkpoint_replay(RUN["accelerator"], RUN["model"], RUN["optimizer"])


@check
def data_parallel_follows_torch_ddp() -> None:
    RUN["dp"] = expect_data_parallel()


@check
def free_memory_forgets_the_run_state_locally() -> None:
    expect_teardown(RUN["dp"])


if __name__ == "__main__":
    run_checks()
