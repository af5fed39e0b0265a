"""fp8 (torchao) for real under torchrun (gloo, CPU): one launch per layout, many checks each.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/fp8/fp8_checks.py <folder> ddp
     PYTHONPATH=tests/harness torchrun --nproc_per_node 4 tests/fp8/fp8_checks.py <folder> tp_fsdp

For the layout, the same MLP on the same data trains STEPS steps in bf16 and in fp8; the fp8 loss
curve stays within LOSS_TOL (relative, per step) of the bf16 one (docs/fp8.md quotes it). Checks:
the conversion report (same on every rank, skipped layers with reasons), the layers are torchao's
Float8Linear inside the wrapper, the optimizer (created before prepare) updates the model's
parameters, replicas stay identical, save_state -> load_state into a fresh fp8 run gives the same
outputs, save_model's weights are plain tensors under the original names that load into the
unconverted model (outputs equal to the converted one's in fp32 within fp8 rounding), and a recipe
handler without fp8 fails on every rank. Each ``@check`` is one test of test_fp8_multiprocess.py, per layout (the
harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import os
import sys
import warnings
from functools import cache

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, ParallelismConfig
from accel.utils import AORecipeKwargs

warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
warnings.filterwarnings("ignore", message=".*may not have complete support.*")

FOLDER, LAYOUT = sys.argv[1], sys.argv[2]
RANK = int(os.environ["RANK"])
STEPS, BATCH, LR = 30, 16, 3e-3
LOSS_TOL = 0.05  # fp8 loss within 5 % of the bf16 loss at every step (docs/fp8.md)


def say(message: str) -> None:
    if RANK == 0:
        print(message, flush=True)


class MLP(nn.Module):
    """inp and out stay in high precision (first / last linear layers); up and down become fp8; odd (40 -> 24) is
    skipped for its shape."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 64)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)
        self.odd = nn.Linear(64, 40)
        self.out = nn.Linear(40, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = h + self.down(torch.relu(self.up(h)))
        return self.out(torch.relu(self.odd(h)))


def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * BATCH * 2, 32, generator=generator)
    w = torch.randn(32, 8, generator=generator)
    return TensorDataset(x, torch.tanh(x @ w))


def fresh_model() -> MLP:
    torch.manual_seed(0)
    return MLP()


def make_accelerator(precision: str, **kwargs) -> Accelerator:
    if LAYOUT == "tp_fsdp":
        plan = {"up": "colwise", "down": "rowwise"}
        kwargs["parallelism_config"] = ParallelismConfig(tp_size=2, dp_shard_size=2, tp_plan=plan)
    return Accelerator(mixed_precision=precision, **kwargs)


def train(precision: str) -> tuple[list[float], Accelerator, nn.Module, torch.optim.Optimizer]:
    accelerator = make_accelerator(precision)
    model = fresh_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)  # before prepare: re-mapped on converted / sharded weights
    loader = DataLoader(data(), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == STEPS:
            break
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    return losses, accelerator, model, optimizer


def input_hooks(module: nn.Module) -> set[str]:
    """The qualified names of the functions a tensor-parallel style hooked on ``module``'s input."""
    names = set()
    for hook in module._forward_pre_hooks.values():
        for cell in getattr(hook, "__closure__", None) or ():
            function = getattr(cell.cell_contents, "func", cell.cell_contents)
            names.add(getattr(function, "__qualname__", ""))
    return names


def full_weights(accelerator: Accelerator, model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.float().clone() for k, v in accelerator.get_state_dict(model).items()}


def outputs(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(x)
    return out.full_tensor() if hasattr(out, "full_tensor") else out


@cache
def runs() -> dict:
    """The bf16 run's losses and the fp8 run (losses, accelerator, model, optimizer), trained by the first check;
    later checks add what the ones after them use."""
    bf16_losses, accelerator, _, _ = train("bf16")
    accelerator.free_memory()
    fp8_losses, accelerator, model, optimizer = train("fp8")
    return {"bf16": bf16_losses, "fp8": fp8_losses, "accelerator": accelerator, "model": model, "optimizer": optimizer}


@check
def the_conversion_report_is_the_same_on_every_rank() -> None:
    accelerator = runs()["accelerator"]
    # The conversion report, the same on every rank.
    report = accelerator.precision.report
    expect(report is not None and report.converted == ["up", "down"], f"converted {report}")
    expect(set(report.skipped) == {"inp", "odd", "out"}, f"skipped {report.skipped}")
    expect(
        "not divisible by 16" in report.skipped["odd"] and "first linear" in report.skipped["inp"],
        f"reasons {report.skipped}",
    )
    reports: list = [None] * dist.get_world_size()
    dist.all_gather_object(reports, (report.converted, report.skipped))
    expect(all(r == reports[0] for r in reports), "conversion reports differ between ranks")


@check
def up_and_down_are_float8_linear_inside_the_wrapper() -> None:
    from torchao.float8.float8_linear import Float8Linear

    accelerator, model, optimizer = runs()["accelerator"], runs()["model"], runs()["optimizer"]
    inner = accelerator.unwrap_model(model)
    expect(isinstance(inner.up, Float8Linear) and isinstance(inner.down, Float8Linear), "up/down are not Float8Linear")
    expect(type(inner.odd) is nn.Linear and type(inner.inp) is nn.Linear, "skipped layers were converted")
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    weight = inner.up.weight
    local = weight._local_tensor if hasattr(weight, "_local_tensor") else weight
    expect(isinstance(local, WeightWithDynamicFloat8CastTensor), f"up.weight is not gathered in float8: {type(local)}")
    if LAYOUT == "tp_fsdp":
        # The plan's colwise / rowwise became torchao's float8 styles (the precision chose them).
        expect(any("Float8ColwiseParallel" in n for n in input_hooks(inner.up)), f"up: {input_hooks(inner.up)}")
        expect(any("Float8RowwiseParallel" in n for n in input_hooks(inner.down)), f"down: {input_hooks(inner.down)}")
    expect(
        accelerator.fp8_backend == "AO" and accelerator.mixed_precision == "fp8", f"backend {accelerator.fp8_backend}"
    )
    model_params = {id(p) for p in model.parameters()}
    expect(
        all(id(p) in model_params for g in optimizer.param_groups for p in g["params"]),
        "optimizer not on the model's parameters",
    )


@check
def fp8_loss_follows_bf16() -> None:
    fp8_losses, bf16_losses = runs()["fp8"], runs()["bf16"]
    # The loss curves: fp8 follows bf16 within LOSS_TOL (relative), and both learn.
    worst = max(abs(a - b) / abs(b) for a, b in zip(fp8_losses, bf16_losses, strict=True))
    expect(len(fp8_losses) == STEPS and worst <= LOSS_TOL, f"fp8 vs bf16: worst relative loss difference {worst:.4f}")
    expect(fp8_losses[-1] < 0.7 * fp8_losses[0], f"fp8 did not learn: {fp8_losses[0]:.4f} -> {fp8_losses[-1]:.4f}")
    say(
        f"LOSS {LAYOUT}: bf16 {bf16_losses[0]:.4f}->{bf16_losses[-1]:.4f} "
        f"fp8 {fp8_losses[0]:.4f}->{fp8_losses[-1]:.4f} max relative difference {worst:.4f} (tolerance {LOSS_TOL})"
    )


@check
def replicas_hold_identical_weights() -> None:
    accelerator, model = runs()["accelerator"], runs()["model"]
    # Replicas identical: the full weights of every rank that holds them (FSDP gathers them on rank 0 only) agree.
    weights = full_weights(accelerator, model)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {k: v.sum().item() for k, v in weights.items()})
    expect(
        len(gathered[0]) == 10 and all(g == gathered[0] for g in gathered if g),
        f"ranks hold different weights: {gathered}",
    )
    shared = [weights]
    dist.broadcast_object_list(shared, src=0)
    runs()["weights"] = shared[0]


@check
def save_state_then_load_state_gives_identical_outputs() -> None:
    accelerator, model = runs()["accelerator"], runs()["model"]
    # save_state -> load_state into a fresh fp8 run: same outputs.
    probe = torch.randn(8, 32, generator=torch.Generator().manual_seed(7))
    before = outputs(model, probe)
    state_dir = os.path.join(FOLDER, f"state_{LAYOUT}")
    accelerator.save_state(state_dir)
    accelerator.save_model(model, os.path.join(FOLDER, f"model_{LAYOUT}"))
    accelerator.free_memory()
    accelerator = make_accelerator("fp8")
    model2 = fresh_model()
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=LR)
    model2, optimizer2, _ = accelerator.prepare(model2, optimizer2, DataLoader(data(), batch_size=BATCH))
    expect(not torch.equal(outputs(model2, probe), before), "a fresh model already gives the trained outputs")
    accelerator.load_state(state_dir)
    after = outputs(model2, probe)
    expect(torch.equal(after, before), f"outputs differ after load_state: {(after - before).abs().max().item():.2e}")
    say(f"SAVE/LOAD STATE {LAYOUT}: identical outputs")
    runs().update(probe_outputs=(probe, before), reloaded=accelerator)


@check
def save_model_writes_plain_weights_the_unconverted_model_loads() -> None:
    (probe, before), weights = runs()["probe_outputs"], runs()["weights"]
    # save_model: plain tensors under the original names, loadable into the unconverted model.
    from safetensors.torch import load_file

    saved = load_file(os.path.join(FOLDER, f"model_{LAYOUT}", "model.safetensors"))
    plain = fresh_model()
    expect(set(saved) == set(plain.state_dict()), f"saved keys {sorted(saved)}")
    expect(all(type(t) is torch.Tensor for t in saved.values()), "saved weights are not plain tensors")
    expect(all(torch.equal(saved[k], weights[k]) for k in saved), "saved weights differ from the trained ones")
    plain.load_state_dict(saved)
    difference = (outputs(plain, probe) - before.float()).abs().max().item()
    expect(difference < 0.1, f"plain model from the saved weights differs from the fp8 one by {difference:.3f}")
    say(f"SAVE_MODEL {LAYOUT}: plain weights, unconverted model within {difference:.4f} of fp8")
    runs()["reloaded"].free_memory()


@check
def a_recipe_without_fp8_fails_on_every_rank() -> None:
    # A recipe without fp8 fails on every rank, before any communication.
    try:
        make_accelerator("bf16", kwargs_handlers=[AORecipeKwargs()])
    except ValueError as error:
        expect("requires setting `mixed_precision='fp8'`" in str(error), f"message: {error}")
    else:
        raise AssertionError("AORecipeKwargs without fp8 did not fail")
    dist.barrier()
    say("ERROR ON EVERY RANK: recipe without fp8")


if __name__ == "__main__":
    run_checks()
