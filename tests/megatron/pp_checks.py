"""Megatron-core pipeline parallelism through accelerator.forward_backward, against one process, on gloo.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 (or 4) tests/megatron/pp_checks.py <tmp_dir>
On 2 processes: a CPU run is refused with the CUDA calls named (before any communication); then, with
those calls sent to the CPU (``cuda_calls_on_cpu``, test-only), PP=2 (1F1B) and PP=2 x 2 virtual
stages (interleaved 1F1B) train 20 steps each, every loss within 1e-5 of one process training the
whole model (and the global gradient norm, clipped), and the gathered weights too; then save_state,
2 steps, load_state, the same 2 steps exactly (one file set per TP x PP rank); a checkpoint of another
vp_degree is refused; under bf16 autocast the stages send bf16 (the pipeline dtype). On 4 processes:
TP=2 x PP=2 likewise.
Each ``@check`` is one test of test_megatron_runs.py, skipped in the launch it does not run in (the harness:
tests/harness/checklist.py).
"""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F
from checklist import check, expect, run_checks, skip
from cuda_calls_on_cpu import cuda_calls_on_cpu
from megatron_checklib import raises
from torch import nn

from accel_checkpoint.errors import CheckpointMismatchError
from accel_core import Accelerator
from accel_megatron import MegatronLMPlugin

TMP = Path(sys.argv[1])
FEATURES, HIDDEN, OUT, SEQ, BATCH, STEPS, LR, CLIP = 6, 8, 3, 3, 8, 20, 1e-2, 0.5


class Block(nn.Module):
    """x + row(tanh(col(x))): Megatron's TP layers when given a config, plain Linear layers (same names) otherwise."""

    def __init__(self, config=None) -> None:
        super().__init__()
        if config is None:
            self.col, self.row = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)
            self.tp = False
            return
        from megatron.core import tensor_parallel

        init = nn.init.xavier_normal_
        self.col = tensor_parallel.ColumnParallelLinear(
            HIDDEN, 2 * HIDDEN, config=config, init_method=init, bias=True, gather_output=False
        )
        self.row = tensor_parallel.RowParallelLinear(
            2 * HIDDEN, HIDDEN, config=config, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False
        )
        self.tp = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp:
            return x + self.row(torch.tanh(self.col(x)[0]))[0]
        return x + self.row(torch.tanh(self.col(x)))


class Net(nn.Module):
    """A chain of units: embed, layers.0..3, head. Between stages travels [batch, sequence, hidden]."""

    def __init__(self, config=None) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, HIDDEN)
        self.layers = nn.ModuleList(Block(config) for _ in range(4))
        self.head = nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, SEQ, FEATURES, generator=g)
        out.append((x, torch.sin(x[..., :OUT]) + 0.1 * torch.randn(BATCH, SEQ, OUT, generator=g)))
    return out


def reference_run() -> tuple[dict[str, torch.Tensor], list[tuple[float, float]], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = Net()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for x, y in batches():
        loss = F.mse_loss(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append((loss.item(), norm.item()))
    return initial, losses, model.state_dict()


def megatron_run(plugin: MegatronLMPlugin, initial: dict[str, torch.Tensor]):
    from megatron.core import parallel_state

    accelerator = Accelerator(megatron_lm_plugin=plugin)
    model = Net(accelerator.strategy.model_parallel_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.load_full_state_dict(initial)
    return accelerator, model, optimizer, parallel_state


def expect_refused_on_cpu(initial: dict[str, torch.Tensor]) -> None:
    with raises(ValueError, "vp_degree=2) needs pp_degree > 1"):
        MegatronLMPlugin(vp_degree=2)
    with raises(ValueError, "num_micro_batches to be a multiple of pp_degree=2"):
        MegatronLMPlugin(pp_degree=2, vp_degree=2, num_micro_batches=3)
    accelerator, model, _, parallel_state = megatron_run(MegatronLMPlugin(pp_degree=2, num_micro_batches=4), initial)
    x, y = batches()[0]
    # Raised on each process before any communication: nobody waits for the others.
    with raises(RuntimeError, "torch.cuda.current_device()"):
        accelerator.forward_backward(model, x, y, F.mse_loss)
    with raises(RuntimeError, "accelerator.forward_backward"):
        model(x)
    parallel_state.destroy_model_parallel()


def replay_from_checkpoint(accelerator: Accelerator, model, optimizer, plugin: MegatronLMPlugin) -> None:
    """save_state, 2 steps, load_state: the same 2 steps exactly. Then a checkpoint of other degrees is refused."""
    x, y = batches()[0]

    def two_steps() -> list[float]:
        losses = []
        for _ in range(2):
            losses.append(accelerator.forward_backward(model, x, y, F.mse_loss).item())
            optimizer.step()
            optimizer.zero_grad()
        return losses

    folder = TMP / f"tp{plugin.tp_degree}_pp{plugin.pp_degree}_vp{plugin.vp_degree}"
    accelerator.save_state(folder)
    expected = two_steps()
    accelerator.load_state(folder)
    again = two_steps()
    expect(again == expected, f"replayed losses {again} vs {expected}")
    other = TMP / "tp1_pp2_vp1"
    if plugin.vp_degree > 1 and other.is_dir():
        with raises(CheckpointMismatchError, "vp_degree=1, this run uses tp_degree=1, pp_degree=2, vp_degree=2"):
            accelerator.load_state(other)


def expect_matches_one_process(plugin: MegatronLMPlugin, reference) -> list[int]:
    initial, losses, final = reference
    accelerator, model, optimizer, parallel_state = megatron_run(plugin, initial)
    stages = plugin.pp_degree * plugin.vp_degree
    dims = accelerator.parallel_dims
    expect(
        (dims.config.size("pp"), dims.tp.size, dims.dp.size)
        == (plugin.pp_degree, plugin.tp_degree, WORLD // (plugin.pp_degree * plugin.tp_degree)),
        f"the job's mesh follows Megatron's groups: {dims}",
    )
    held = {name for stage in model.stage_modules for name, _ in stage.named_parameters()}
    if plugin.pp_degree > 1:
        expect(len(held) < len(initial), f"each rank holds its stages only: {sorted(held)}")
    expect({p for p in optimizer.param_groups[0]["params"]} <= set(model.parameters()), "optimizer on local stages")
    sizes: list[int] = []  # the samples of each micro-batch the loss was computed on (on the last stage)

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        sizes.append(target.shape[0])
        return F.mse_loss(output, target)

    with cuda_calls_on_cpu():
        for step, (x, y) in enumerate(batches()):
            loss = accelerator.forward_backward(model, x, y, loss_fn)
            norm = accelerator.clip_grad_norm_(model.parameters(), CLIP)  # the whole model's: over TP x PP
            optimizer.step()
            optimizer.zero_grad()
            got, expected = (loss.item(), norm.item()), losses[step]
            worst = max(abs(a - b) for a, b in zip(got, expected, strict=True))
            expect(worst <= 1e-5, f"{stages} stages, step {step}: (loss, norm) {got} vs {expected}")
    full = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        expect(sorted(full) == sorted(final), f"gathered keys {sorted(full)}")
        for key, value in final.items():
            expect(torch.allclose(full[key], value, atol=1e-5, rtol=1e-5), f"{key} differs after training")
    with cuda_calls_on_cpu():
        replay_from_checkpoint(accelerator, model, optimizer, plugin)
    parallel_state.destroy_model_parallel()
    return sizes


def expect_bf16_activations(reference) -> None:
    """Under bf16 autocast a stage sends bf16, the dtype of Megatron's receive buffers (the autocast wrapper returns
    fp32: sent as it is, the bytes would not match the buffer). What Accelerator(mixed_precision="bf16") sets up on
    GPUs is set up by hand here (the strategy refuses bf16 on CPU for its TP layers' backward, not for the pipeline):
    autocast around each stage, bf16 as the pipeline dtype; the model has no TP layer."""
    from megatron.core import parallel_state

    from accel_core.precision.modes import AutocastPrecision

    initial, losses, _ = reference
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(pp_degree=2, num_micro_batches=4))
    model = accelerator.prepare(Net())  # plain layers: Megatron's TP layers re-enter autocast in backward on CUDA only
    model.load_full_state_dict(initial)
    for stage in model.stage_modules:
        AutocastPrecision("bf16", "cpu").wrap_forward(stage)
    model.config.pipeline_dtype = torch.bfloat16
    x, y = batches()[0]
    with cuda_calls_on_cpu():
        loss = accelerator.forward_backward(model, x, y, F.mse_loss)
    stage = model.chunks[0]
    if parallel_state.is_pipeline_first_stage():
        with torch.no_grad():
            sent = stage(x)
        expect(sent.dtype == torch.bfloat16, f"the first stage sends {sent.dtype}, the pipeline dtype is bfloat16")
    else:
        received = stage.input_tensor
        expect(received is not None and received.dtype == torch.bfloat16, f"the last stage received {received}")
        expect(not stage.sends_activation, "the last stage's output is the loss function's input, not sent")
    expected = losses[0][0]
    expect(abs(loss.item() - expected) <= 2e-2 * abs(expected), f"bf16 pipeline loss {loss.item()} vs fp32 {expected}")
    parallel_state.destroy_model_parallel()


WORLD = int(os.environ["WORLD_SIZE"])


@cache
def reference() -> tuple[dict[str, torch.Tensor], list[tuple[float, float]], dict[str, torch.Tensor]]:
    return reference_run()


def on_processes(count: int) -> None:
    if count != WORLD:
        skip(f"runs in the {count}-process launch")


@check
def a_cpu_run_is_refused_naming_the_cuda_calls() -> None:
    on_processes(2)
    expect_refused_on_cpu(reference()[0])


@check
def pp2_1f1b_matches_one_process() -> None:
    on_processes(2)
    expect_matches_one_process(MegatronLMPlugin(pp_degree=2, num_micro_batches=4), reference())


@check
def bf16_autocast_stages_send_bf16() -> None:
    on_processes(2)
    expect_bf16_activations(reference())


@check
def pp2_with_2_virtual_stages_interleaved_matches_one_process() -> None:
    on_processes(2)
    expect_matches_one_process(MegatronLMPlugin(pp_degree=2, vp_degree=2, num_micro_batches=4), reference())


@check
def micro_batches_without_pipeline_run_megatrons_no_pipelining_schedule() -> None:
    # TP=2 on 2 processes and DP=2 (tp_degree=1), each with num_micro_batches=4 and no pipeline stages: Megatron's
    # forward_backward_no_pipelining runs 4 micro-batches of 2 samples per step, and each step's loss, clipped norm
    # and the trained weights equal one process's full-batch run (the mean over equal micro-batches is the batch's).
    from megatron.core.pipeline_parallel import schedules

    on_processes(2)
    real = schedules.forward_backward_no_pipelining
    runs: list[int] = []

    def counted(*args, **kwargs):
        runs.append(kwargs["num_microbatches"])
        return real(*args, **kwargs)

    schedules.forward_backward_no_pipelining = counted
    try:
        for plugin in (MegatronLMPlugin(tp_degree=2, num_micro_batches=4), MegatronLMPlugin(num_micro_batches=4)):
            runs.clear()
            sizes = expect_matches_one_process(plugin, reference())
            expect(runs[:STEPS] == [4] * STEPS, f"{plugin}: the no-pipelining schedule ran each step: {runs}")
            expect(sizes[:4] == [BATCH // 4] * 4, f"{plugin}: micro-batches of {BATCH // 4} samples: {sizes[:4]}")
    finally:
        schedules.forward_backward_no_pipelining = real


@check
def tp2_x_pp2_matches_one_process() -> None:
    on_processes(4)
    expect_matches_one_process(MegatronLMPlugin(tp_degree=2, pp_degree=2, num_micro_batches=4), reference())


if __name__ == "__main__":
    run_checks()
