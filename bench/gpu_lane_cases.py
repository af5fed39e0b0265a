"""The cases of the GPU lane (bench/gpu_lane.py runs each under torchrun): accel's CUDA paths that CPU tests cannot run.

    torchrun --nproc_per_node 2 bench/gpu_lane_cases.py nccl_ddp      # one case; rank 0 prints its LANE RESULT line

Each case raises on a failed check (the lane reports the message) and returns what it measured; one that cannot
run on this machine (no such hardware or library) raises ``Skip`` with the reason, which the lane reports. Under
``ACCEL_USE_CPU=true`` (the lane's ``--cpu`` dry run) the same code runs over gloo, without the checks that
only a GPU can answer (where buffers and shards live against the compute device, GPU memory), and Megatron's
pipeline schedules run through the tests' CUDA-call redirection (tests/megatron/cuda_calls_on_cpu.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DRY = os.environ.get("ACCEL_USE_CPU", "").lower() in ("1", "true", "yes")
FEATURES, HIDDEN, OUT, SEQ, BATCH = 16, 32, 8, 8, 8


class Block(nn.Module):
    """x + fc2(gelu(fc1(x))) * scale, with ``scale`` a non-persistent buffer (as a rotary table is)."""

    scale: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, HIDDEN), persistent=False)

    def reset_parameters(self) -> None:  # the buffer's initialiser (a meta-built model gets it from here)
        self.scale.copy_(torch.linspace(0.5, 1.5, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x))) * self.scale


class LaneNet(nn.Module):
    """A chain of units (embed, layers.0-3, head): [batch, sequence, hidden] between them, as pipelines want."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def net(seed: int = 0) -> LaneNet:
    torch.manual_seed(seed)
    return LaneNet()


def batch(step: int, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, SEQ, FEATURES, generator=g)
    return x, torch.sin(x[..., :OUT])


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


class Skip(Exception):
    """Raised by a case that cannot run on this machine (its hardware or library is missing): the lane reports it
    as skipped with this reason, neither a pass nor a failure."""


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def gpu_used_mib() -> float | None:
    """GPU memory in use on this process's device (NCCL's buffers are outside torch's allocator: ask the driver)."""
    if DRY or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def fsdp_plugin(**kwargs):
    from accel.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(fsdp_version=2, transformer_cls_names_to_wrap=["Block"], **kwargs)


def train(accelerator, model, steps: int = 3) -> list[float]:
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
    losses = []
    for step in range(steps):
        x, y = (t.to(accelerator.device) for t in batch(step, accelerator.process_index))
        loss = F.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    expect(all(math.isfinite(v) for v in losses), f"non-finite losses {losses}")
    return losses


def check_placement(accelerator, model, what: str) -> None:
    """Shards on the CPU (FSDP2's offload), buffers on the compute device (FSDP2 offloads parameters only)."""
    shards = {p.to_local().device.type for p in model.parameters()}
    expect(shards == {"cpu"}, f"{what}: offloaded shards on {shards}")
    buffers = {b.device for b in model.buffers()}
    expect(buffers == {accelerator.device}, f"{what}: buffers on {buffers}, the compute device is {accelerator.device}")


# -- the cases ----------------------------------------------------------------------------------------------------
def fsdp2_offload_meta_init() -> str:
    """FSDP2 + CPU offload of a model built on the meta device (and, with 2+ processes, of process 0's weights)."""
    from accel import Accelerator

    accelerator = Accelerator(fsdp_plugin=fsdp_plugin(cpu_offload=True))
    with torch.device("meta"):
        model = LaneNet()
    model = accelerator.prepare(model)
    check_placement(accelerator, model, "meta init")
    losses = train(accelerator, model)
    detail = f"meta init: losses {losses[0]:.3f} -> {losses[-1]:.3f}"
    if world() > 1:
        accelerator = Accelerator(fsdp_plugin=fsdp_plugin(cpu_offload=True, cpu_ram_efficient_loading=True))
        if accelerator.is_main_process:
            model = net(seed=7)
        else:
            with torch.device("meta"):
                model = LaneNet()
        model = accelerator.prepare(model)
        check_placement(accelerator, model, "process 0's weights")
        state = accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            expected = net(seed=7).state_dict()
            expect(all(torch.equal(state[k].cpu(), expected[k]) for k in expected), "weights differ from process 0's")
        train(accelerator, model)
        detail += "; process 0's weights scattered"
    return detail


def fsdp2_sync_module_states() -> str:
    """sync_module_states=True with the model still on the CPU: process 0's weights reach every process (NCCL)."""
    from accel import Accelerator

    accelerator = Accelerator(fsdp_plugin=fsdp_plugin(sync_module_states=True))
    model = accelerator.prepare(net(seed=accelerator.process_index))  # built on the CPU, different on each process
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        expected = net(seed=0).state_dict()
        expect(all(torch.equal(state[k].cpu(), expected[k]) for k in expected), "weights differ from process 0's")
    x = batch(0)[0].to(accelerator.device)
    with torch.no_grad():
        outputs = accelerator.gather(model(x).unsqueeze(0))
    expect(all(torch.equal(outputs[0], o) for o in outputs), "processes hold different models")
    return f"{accelerator.num_processes} processes start from process 0's weights"


@contextlib.contextmanager
def _megatron_on_this_device() -> Iterator[None]:
    if not DRY:
        yield
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "megatron"))
    from cuda_calls_on_cpu import cuda_calls_on_cpu  # pyright: ignore[reportMissingImports]  # the dry run only: megatron-core's schedules call CUDA

    with cuda_calls_on_cpu():
        yield


def megatron_pp_bf16() -> str:
    """Megatron pipeline (pp=2) under bf16: a stage sends the pipeline dtype, the loss follows fp32."""
    from megatron.core import parallel_state

    from accel import Accelerator
    from accel_megatron import MegatronLMPlugin

    precision = "no" if DRY else "bf16"  # the strategy refuses bf16 on CPU (its TP layers' backward)
    accelerator = Accelerator(
        megatron_lm_plugin=MegatronLMPlugin(pp_degree=2, num_micro_batches=4), mixed_precision=precision
    )
    model = accelerator.prepare(net())
    if DRY:  # what bf16 sets up on GPUs, by hand
        from accel_core.precision.modes import AutocastPrecision

        for stage in model.stage_modules:
            AutocastPrecision("bf16", "cpu").wrap_forward(stage)
        model.config.pipeline_dtype = torch.bfloat16
    expect(model.config.pipeline_dtype == torch.bfloat16, f"pipeline dtype {model.config.pipeline_dtype}")
    x, y = batch(0)
    reference = F.mse_loss(net()(x), y).item()
    with _megatron_on_this_device():
        loss = accelerator.forward_backward(model, x.to(accelerator.device), y.to(accelerator.device), F.mse_loss)
    stage = model.chunks[0]
    if parallel_state.is_pipeline_first_stage():
        with torch.no_grad():
            sent = stage(x.to(accelerator.device))
        expect(sent.dtype == torch.bfloat16, f"the first stage sends {sent.dtype}")
    else:
        received = stage.input_tensor
        expect(received is not None and received.dtype == torch.bfloat16, f"the last stage received {received}")
    expect(abs(loss.item() - reference) <= 3e-2 * abs(reference), f"bf16 loss {loss.item()} vs fp32 {reference}")
    parallel_state.destroy_model_parallel()
    return f"loss {loss.item():.4f} vs fp32 {reference:.4f}, bf16 between stages"


def _process_groups(device_id: bool) -> str:
    """Process groups and GPU memory once a DDP Accelerator is set up, then after one step."""
    from accel import Accelerator

    start = time.perf_counter()
    if not device_id and world() > 1:
        # Joined before the Accelerator (which adopts the group): NCCL then connects each group at its first use.
        dist.init_process_group(backend="gloo" if DRY else "nccl")
    accelerator = Accelerator()
    setup_s = time.perf_counter() - start
    groups = len(dist.distributed_c10d._world.pg_map) if dist.is_initialized() else 0  # the default one included
    after_setup = gpu_used_mib()
    model = accelerator.prepare(net().to(accelerator.device))
    train(accelerator, model, steps=1)
    after_step = gpu_used_mib()
    memory = "n/a (CPU)" if after_setup is None else f"{after_setup:.0f} MiB after setup, {after_step:.0f} after a step"
    return f"{groups} groups, {memory}, setup {setup_s:.2f} s"


def process_groups_device_id() -> str:
    """The default (device_id given to init_process_group: NCCL connects every group as it is made)."""
    return _process_groups(device_id=True)


def process_groups_lazy() -> str:
    """Without device_id: NCCL connects a group at its first collective."""
    return _process_groups(device_id=False)


def nccl_ddp() -> str:
    """DDP over NCCL: replicas stay identical, a gather returns every rank's tensor in order."""
    from accel import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(net().to(accelerator.device))
    losses = train(accelerator, model, steps=5)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).unsqueeze(0)
    replicas = accelerator.gather(flat)
    expect(all(torch.equal(replicas[0], r) for r in replicas), "replicas differ after 5 steps")
    ranks = accelerator.gather(torch.tensor([accelerator.process_index], device=accelerator.device))
    expect(ranks.tolist() == list(range(accelerator.num_processes)), f"gathered ranks {ranks.tolist()}")
    return f"losses {losses[0]:.3f} -> {losses[-1]:.3f}; replicas identical over {accelerator.num_processes} processes"


def _fp16_skips_an_inf_step(accelerator, model) -> float:
    """Trains 3 steps, then an inf gradient: the step is skipped and the scale lowered."""
    train(accelerator, model)
    optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
    x, y = (t.to(accelerator.device) for t in batch(9))
    accelerator.backward(F.mse_loss(model(x).float(), y))
    scale = accelerator.scaler.get_scale()
    for p in model.parameters():
        if p.grad is not None:
            p.grad.fill_(float("inf"))  # DTensor gradients too: fill_ acts on the local shard
            break
    optimizer.step()
    expect(optimizer.step_was_skipped, "an inf gradient did not skip the step")
    expect(accelerator.scaler.get_scale() < scale, "the loss scale did not drop after an inf gradient")
    return scale


def fp16_grad_scaler() -> str:
    """fp16 autocast with torch's GradScaler (DDP or one process)."""
    from accel import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    expect(accelerator.scaler is not None, "fp16 without a grad scaler")
    model = accelerator.prepare(net().to(accelerator.device))
    scale = _fp16_skips_an_inf_step(accelerator, model)
    return f"{type(accelerator.scaler).__name__}, inf step skipped at scale {scale:.0f}"


def fp16_fsdp2_cpu_offload() -> str:
    """fp16 + FSDP2 + CPU offload: the sharded scaler, offloaded shards, buffers on the GPU."""
    from accel import Accelerator

    accelerator = Accelerator(mixed_precision="fp16", fsdp_plugin=fsdp_plugin(cpu_offload=True))
    model = accelerator.prepare(net())
    check_placement(accelerator, model, "fp16 + offload")
    scale = _fp16_skips_an_inf_step(accelerator, model)
    return f"{type(accelerator.scaler).__name__}, inf step skipped at scale {scale:.0f}"


def _fp8_settings(compile_: bool) -> argparse.Namespace:
    """bench/fp8_step.py's settings for one case. On a GPU its width (4096: fp8 GEMMs pay from there), half its
    depth and 12 steps, to fit the lane's 10 minutes; on the dry run a 64-wide model (checks the script only)."""
    if DRY:
        return argparse.Namespace(dim=64, depth=2, batch=64, steps=4, warmup=1, lr=1e-4, compile=False, cpu=True)
    return argparse.Namespace(dim=4096, depth=2, batch=8192, steps=12, warmup=4, lr=1e-4, compile=compile_, cpu=False)


def _fp8_capable() -> None:
    """Skips where fp8 cannot run: a GPU below compute capability 8.9 (accel would run fp16 instead)."""
    if DRY:
        return  # torchao's float8 linear has a CPU kernel
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        raise Skip(
            f"{torch.cuda.get_device_name()} has compute capability {major}.{minor}, fp8 needs 8.9 (Ada, Hopper): "
            "accel would fall back to fp16"
        )


def _fp8_against_bf16(handler: Any, compile_: bool, package: str) -> str:
    """The same model trained in bf16, then in fp8 with ``handler`` (bench/fp8_step.py's run): the layers accel
    reports converted must be ``package``'s modules, the losses finite and near bf16's."""
    from fp8_step import run  # bench/, this script's folder, is sys.path[0]

    settings = _fp8_settings(compile_)
    bf16 = run("bf16", "bf16", [], settings)
    fp8 = run("fp8", "fp8", [handler], settings)
    expect(fp8["mode"] == "fp8", f"accel ran {fp8['mode']}, not fp8")
    expect(bool(fp8["layers"]), "accel converted no layer to fp8")
    foreign = {name: kind for name, kind in fp8["classes"].items() if not kind.startswith(package + ".")}
    expect(not foreign, f"layers reported converted are not {package}'s: {foreign}")
    expect(all(math.isfinite(v) for v in fp8["losses"]), f"non-finite fp8 losses {fp8['losses']}")
    drift = abs(fp8["losses"][-1] - bf16["losses"][-1]) / abs(bf16["losses"][-1])
    expect(drift < 0.1, f"fp8 final loss {fp8['losses'][-1]:.5f} vs bf16 {bf16['losses'][-1]:.5f}")
    speed = f"{fp8['step'] / bf16['step']:.2f}x bf16's " + (
        "(CPU: not a speed figure)" if DRY else "(compiled)" if settings.compile else "(eager)"
    )
    memory = "" if fp8["peak_mib"] is None else f", peak {fp8['peak_mib']:.0f} vs {bf16['peak_mib']:.0f} MiB"
    return (
        f"{len(fp8['layers'])} layers converted ({', '.join(fp8['layers'])}); step {1000 * fp8['step']:.1f} ms, "
        f"{speed}{memory}; final loss {fp8['losses'][-1]:.4f} vs bf16 {bf16['losses'][-1]:.4f}"
    )


def fp8_torchao() -> str:
    """fp8 through torchao (tensorwise recipe, compiled on a GPU as its speed needs) against bf16."""
    _fp8_capable()
    from accel.utils import AORecipeKwargs, is_torchao_available

    if not is_torchao_available():
        from accel_core.install_hints import accel_extra

        raise Skip(f"torchao is not installed: {accel_extra('fp8')}")
    return _fp8_against_bf16(AORecipeKwargs(recipe_name="tensorwise"), compile_=True, package="torchao")


def fp8_transformer_engine() -> str:
    """fp8 through Transformer-Engine (its DelayedScaling recipe, accel's defaults) against bf16, both eager."""
    if DRY:
        raise Skip("Transformer-Engine runs on CUDA GPUs only (this is the --cpu dry run)")
    _fp8_capable()
    from accel.utils import TERecipeKwargs, is_transformer_engine_available

    if not is_transformer_engine_available():
        raise Skip('transformer_engine is not installed: pip install "accel-fp8[te]" (needs the CUDA toolkit)')
    return _fp8_against_bf16(TERecipeKwargs(), compile_=False, package="transformer_engine")


CASES: dict[str, Callable[[], str]] = {
    "fsdp2_offload_meta_init": fsdp2_offload_meta_init,
    "fsdp2_sync_module_states": fsdp2_sync_module_states,
    "megatron_pp_bf16": megatron_pp_bf16,
    "process_groups_device_id": process_groups_device_id,
    "process_groups_lazy": process_groups_lazy,
    "nccl_ddp": nccl_ddp,
    "fp16_grad_scaler": fp16_grad_scaler,
    "fp16_fsdp2_cpu_offload": fp16_fsdp2_cpu_offload,
    "fp8_torchao": fp8_torchao,
    "fp8_transformer_engine": fp8_transformer_engine,
}


def main() -> None:
    name = sys.argv[1]
    try:
        line = "LANE RESULT " + json.dumps({"case": name, "detail": CASES[name]()})
    except Skip as why:  # the lane reads this line: skipped, with the reason
        line = "LANE SKIP " + json.dumps({"case": name, "reason": str(why)})
    if int(os.environ.get("RANK", "0")) == 0:
        print(line, flush=True)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
