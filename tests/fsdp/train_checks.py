"""accel-fsdp training checks in one 2-process launch (gloo, CPU).

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/fsdp/train_checks.py
Each ``@check`` is one test of test_fsdp_multiprocess.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import json
import logging
import math

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from fsdp_testlib import (
    LR,
    MAX_NORM,
    STEPS,
    Net,
    data,
    ddp_reference,
    full_nbytes,
    held_bytes,
    local,
    local_nbytes,
    make_net,
    optimizer_state_nbytes,
    param_groups,
)
from torch import nn

from accel_core import Accelerator, DistributedType
from accel_fsdp import FullyShardedDataParallelPlugin

TOL = 1e-5
logging.basicConfig(level=logging.WARNING)


class RecordLogs(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


records = RecordLogs()
logging.getLogger("accel_fsdp").addHandler(records)


def plugin(**kwargs) -> FullyShardedDataParallelPlugin:
    kwargs.setdefault("transformer_cls_names_to_wrap", ["Block"])
    return FullyShardedDataParallelPlugin(**kwargs)


first = Accelerator(fsdp_plugin=plugin())
rank, world = first.process_index, first.num_processes
REF = ddp_reference(rank, world)


@check
def scripts_reach_the_plugin_through_the_state() -> None:
    # Scripts written for the reference API reach the plugin through the state.
    expect(
        first.state.fsdp_plugin is first.strategy.plugin and first.state.deepspeed_plugin is None, "state.fsdp_plugin"
    )


def close(a: float, b: float, what: str, tol: float = TOL) -> None:
    expect(abs(a - b) <= tol * max(1.0, abs(b)), f"{what}: {a} != {b}")


def compare_state(accelerator: Accelerator, model: nn.Module, what: str, tol: float = TOL) -> None:
    state = accelerator.get_state_dict(model)  # gathered on process 0 only
    if rank == 0:
        expect(set(state) == set(REF["state"]), f"{what}: state dict keys {sorted(state)[:4]}...")
        worst = max((state[k].float() - REF["state"][k]).abs().max().item() for k in REF["state"])
        expect(worst <= tol, f"{what}: final weights differ from DDP's by {worst}")
    else:
        expect(state == {}, f"{what}: get_state_dict should gather on process 0 only")


def train(
    accelerator: Accelerator, model, optimizer, scheduler=None, micro: int = 1, unreduced: bool = False
) -> tuple[list[float], list[float]]:
    """The DDP reference's loop through the Accelerator; ``micro`` micro-batches per step.

    unreduced: check that on micro-steps FSDP2 kept the gradients unreduced (no_sync took effect).
    """
    losses, norms = [], []
    for step in range(STEPS):
        x, y = data(step)
        xs, ys = local(x, rank, world).chunk(micro), local(y, rank, world).chunk(micro)
        total = 0.0
        for i in range(micro):
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(xs[i]), ys[i])
                accelerator.backward(loss)
                total += loss.item() / micro
                if accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)))
                elif unreduced:
                    # FSDP2 keeps the unreduced gradients to itself until the synced micro-step.
                    expect(all(p.grad is None for p in model.parameters()), "no_sync: gradients were reduced anyway")
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                optimizer.zero_grad()
        losses.append(total)
    return losses, norms


def compare_run(what: str, losses: list[float], norms: list[float]) -> None:
    expect(len(norms) == STEPS, f"{what}: {len(norms)} clip calls")
    for step in range(STEPS):
        close(losses[step], REF["losses"][step], f"{what}: loss at step {step}")
        close(norms[step], REF["norms"][step], f"{what}: clip norm at step {step}")


def expect_version_follows_ddp(version: int) -> None:
    name = f"FSDP{version}"
    records.messages.clear()
    accelerator = first if version == 2 else Accelerator(fsdp_plugin=plugin(fsdp_version=1))
    expect(
        accelerator.distributed_type == DistributedType.FSDP, f"{name}: distributed_type {accelerator.distributed_type}"
    )
    model = make_net()
    optimizer = torch.optim.AdamW(param_groups(model), lr=LR)  # before prepare: must be rebuilt
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    raw = optimizer.optimizer
    live = {id(p) for p in model.parameters()}
    expect(
        all(id(p) in live for g in raw.param_groups for p in g["params"]),
        f"{name}: optimizer not on the sharded parameters",
    )
    expect([g["weight_decay"] for g in raw.param_groups] == [0.1, 0.0], f"{name}: param groups lost")
    expect([g["lr"] for g in raw.param_groups] == [LR, LR / 2], f"{name}: per-group lr lost")
    expect(scheduler.scheduler.optimizer is raw, f"{name}: scheduler still points at the old optimizer")
    if rank == 0 and version == 2:  # FSDP1 with use_orig_params keeps the Parameter objects: nothing to rebuild
        expect(
            any("rebuilt" in m for m in records.messages), f"{name}: the rebuild was not announced: {records.messages}"
        )

    full = full_nbytes(make_net())
    held = local_nbytes(model.parameters())
    expect(abs(held - full / world) <= 0.01 * full, f"{name}: holds {held} of {full} parameter bytes")
    if version == 2:
        from torch.distributed.fsdp import FSDPModule

        unwrapped = accelerator.unwrap_model(model)
        expect(
            isinstance(unwrapped, Net) and isinstance(unwrapped, FSDPModule),
            f"{name}: unwrap_model gave {type(unwrapped)}",
        )
        expect(all(isinstance(b, FSDPModule) for b in model.blocks), f"{name}: blocks not wrapped")
    else:
        expect(
            type(accelerator.unwrap_model(model)) is Net,
            f"{name}: unwrap_model gave {type(accelerator.unwrap_model(model))}",
        )

    losses, norms = train(accelerator, model, optimizer, scheduler)
    compare_run(name, losses, norms)
    expect(any(n > MAX_NORM for n in norms), f"{name}: clipping never active, the check proves nothing")
    compare_state(accelerator, model, name)
    if version == 2:
        expect(all(p.grad is None for p in model.parameters()), "zero_grad left gradients")
        x, y = data(0)
        nn.functional.mse_loss(model(local(x, rank, world)), local(y, rank, world)).backward()
        grad_bytes = local_nbytes(p.grad for p in model.parameters())
        expect(grad_bytes == full // world, f"{name}: gradients take {grad_bytes} bytes, expected {full // world}")
        state_bytes = optimizer_state_nbytes(raw)
        expect(
            state_bytes == 2 * full // world,
            f"{name}: AdamW state takes {state_bytes} bytes, expected {2 * full // world}",
        )
        # test_fsdp_multiprocess.py compares these with `accel estimate-memory`.
        held = {"ddp": REF["held_bytes"], "fsdp": held_bytes(model, raw)}
        print(f"HELD BYTES {json.dumps({'rank': rank, **held})}", flush=True)
        inf_norm = float(accelerator.clip_grad_norm_(model.parameters(), 1e9, norm_type=math.inf))
        local_max = max(p.grad.to_local().abs().max().item() for p in model.parameters())
        gathered = [None, None]
        dist.all_gather_object(gathered, local_max)
        close(inf_norm, max(gathered), f"{name}: inf-norm")
        optimizer.zero_grad()

    # A method other than forward, using the root's own (sharded) parameters.
    x, _ = data(0)
    reference = make_net()
    reference.load_state_dict(REF["state"])
    with torch.no_grad():
        expect(torch.equal(model.generate(x), reference.generate(x)), f"{name}: generate() after wrapping")

    # Gradient accumulation: two micro-batches per step follow the same trajectory.
    accumulating = Accelerator(fsdp_plugin=plugin(fsdp_version=version), gradient_accumulation_steps=2)
    model = make_net()
    model = accumulating.prepare(model)
    optimizer = accumulating.prepare(torch.optim.AdamW(param_groups(model), lr=LR))  # built after prepare(model)
    losses, norms = train(accumulating, model, optimizer, micro=2, unreduced=version == 2)
    compare_run(f"{name} accumulation", losses, norms)
    compare_state(accumulating, model, f"{name} accumulation")


@check
def fsdp2_follows_ddp() -> None:
    expect_version_follows_ddp(2)


@check
def fsdp1_follows_ddp() -> None:
    expect_version_follows_ddp(1)


@check
def meta_device_init() -> None:
    """A model built on the meta device is materialised shard by shard."""
    accelerator = Accelerator(fsdp_plugin=plugin())
    with torch.device("meta"):
        model = Net()
    model = accelerator.prepare(model)
    expect(not any(p.is_meta for p in model.parameters()), "meta parameters left after prepare")
    expect(local_nbytes(model.parameters()) == full_nbytes(make_net()) // world, "meta init: shard sizes")
    weights = [p.full_tensor() for p in model.parameters()]
    expect(all(torch.isfinite(w).all() for w in weights), "meta init: non-finite weights (uninitialised memory?)")
    # reset_parameters ran: Linear weights are uniform within 1/sqrt(fan_in), LayerNorm weights are ones.
    expect(torch.equal(model.blocks[0].norm.weight.full_tensor(), torch.ones(16)), "meta init: LayerNorm not reset")
    bound = 1 / math.sqrt(16)
    w = model.blocks[0].fc1.weight.full_tensor()
    expect(
        w.abs().max() <= bound and w.std() > bound / 4, f"meta init: fc1 weights look uninitialised ({w.abs().max()})"
    )
    x, y = data(0)
    out = model(x)
    gathered = [None, None]
    dist.all_gather_object(gathered, out.detach())
    expect(torch.equal(gathered[0], gathered[1]), "meta init: processes hold different models")
    nn.functional.mse_loss(out, y).backward()

    # cpu_ram_efficient_loading: only process 0 has real weights; they are scattered to the shards.
    accelerator = Accelerator(fsdp_plugin=plugin(cpu_ram_efficient_loading=True))
    if rank == 0:
        model = make_net(seed=7)
    else:
        with torch.device("meta"):
            model = Net()
    model = accelerator.prepare(model)
    state = accelerator.get_state_dict(model)
    if rank == 0:
        expected = make_net(seed=7).state_dict()
        expect(
            all(torch.equal(state[k], expected[k]) for k in expected),
            "cpu_ram_efficient_loading: weights differ from process 0's",
        )

    # With CPU offload: the shards are allocated and filled on the compute device (process 0's broadcast runs
    # there), then the sharded parameters go to the CPU, where FSDP2's offload policy wants them at the first
    # forward. (On a GPU the buffers stay on it: bench/gpu_lane.py's fsdp2_offload_meta_init case.)
    for loading in (False, True):
        accelerator = Accelerator(fsdp_plugin=plugin(cpu_offload=True, cpu_ram_efficient_loading=loading))
        if loading and rank == 0:
            model = make_net(seed=7)
        else:
            with torch.device("meta"):
                model = Net()
        model = accelerator.prepare(model)
        where = {p.to_local().device.type for p in model.parameters()}
        expect(where == {"cpu"}, f"offload (process 0's weights: {loading}): shards on {where}")
        nn.functional.mse_loss(model(x), y).backward()  # FSDP2's first forward checks the offloaded shards
        state = accelerator.get_state_dict(model)
        if loading and rank == 0:
            expected = make_net(seed=7).state_dict()
            expect(
                all(torch.equal(state[k], expected[k]) for k in expected), "offload: weights differ from process 0's"
            )


VARIANTS = [
    {"activation_checkpointing": True},
    {"activation_checkpointing": True, "fsdp_version": 1},
    {"sharding_strategy": "SHARD_GRAD_OP"},
    {"sharding_strategy": "HYBRID_SHARD"},
    {"cpu_offload": True},
    {"auto_wrap_policy": "size_based_wrap", "min_num_params": 500, "transformer_cls_names_to_wrap": None},
    {"sharding_strategy": "SHARD_GRAD_OP", "fsdp_version": 1, "use_orig_params": False},
    {"sharding_strategy": "HYBRID_SHARD", "fsdp_version": 1},
    {"sharding_strategy": "NO_SHARD", "fsdp_version": 1},
]


@check
def plugin_variants() -> None:
    """Sharding layouts, offload and activation checkpointing change memory, not results: first step vs DDP."""
    x, y = data(0)
    xl, yl = local(x, rank, world), local(y, rank, world)
    for variant in VARIANTS:
        accelerator = Accelerator(fsdp_plugin=plugin(**variant))
        model = make_net()
        model, optimizer = accelerator.prepare(model, torch.optim.AdamW(param_groups(model), lr=LR))
        loss = nn.functional.mse_loss(model(xl), yl)
        accelerator.backward(loss)
        close(loss.item(), REF["losses"][0], f"{variant}: loss")
        norm = float(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM))
        close(norm, REF["norms"][0], f"{variant}: gradient norm")
        optimizer.step()
        optimizer.zero_grad()
        next_loss = nn.functional.mse_loss(model(local(data(1)[0], rank, world)), local(data(1)[1], rank, world)).item()
        if variant.get("use_orig_params", True):
            close(next_loss, REF["losses"][1], f"{variant}: loss after one step")
        else:  # flat parameters: the two param groups became one (and the user was told)
            expect(len(optimizer.param_groups) == 1, f"{variant}: {len(optimizer.param_groups)} param groups")
            expect(
                rank != 0 or any("one group" in m for m in records.messages),
                f"{variant}: conflated groups not announced",
            )
        state = accelerator.get_state_dict(model)
        expect(rank != 0 or set(state) == set(REF["state"]), f"{variant}: parameter names changed: {sorted(state)[:3]}")

    # Ignored modules stay whole and unsharded on every process.
    accelerator = Accelerator(fsdp_plugin=plugin(ignored_modules="head"))
    model = accelerator.prepare(make_net())
    expect(
        not hasattr(model.head.weight, "to_local") and model.head.weight.shape == (4, 16), "ignored head was sharded"
    )
    expect(hasattr(model.inp.weight, "to_local"), "the rest should be sharded")

    # sync_module_states: every process starts from process 0's weights, scattered shard by shard once sharded:
    # its non-persistent buffers and the weights of the modules FSDP ignores (whole on every process) too.
    accelerator = Accelerator(fsdp_plugin=plugin(sync_module_states=True, ignored_modules="head"))
    model = make_net(seed=rank)
    model.register_buffer("offset", torch.full((3,), float(rank + 1)), persistent=False)
    model = accelerator.prepare(model)
    expect(torch.equal(model.offset, torch.ones(3)), f"sync_module_states: process 0's buffer, got {model.offset}")
    expect(
        torch.equal(model.head.weight.detach(), make_net(seed=0).head.weight.detach()),
        "sync_module_states: the ignored head is not process 0's",
    )
    state = accelerator.get_state_dict(model)
    if rank == 0:
        expected = make_net(seed=0).state_dict()
        expect(
            all(torch.equal(state[k], expected[k]) for k in expected),
            "sync_module_states: weights differ from process 0's",
        )


@check
def mixed_precision_bf16_and_fp16() -> None:
    x, y = data(0)
    xl, yl = local(x, rank, world), local(y, rank, world)
    # bf16: parameters gathered in bf16, fp32 master shards, fp32 outputs, loss close to fp32.
    accelerator = Accelerator(fsdp_plugin=plugin(), mixed_precision="bf16")
    model = accelerator.prepare(make_net())
    out = model(xl)
    expect(out.dtype == torch.float32, f"bf16: outputs are {out.dtype}, expected fp32")
    loss = nn.functional.mse_loss(out, yl)
    close(loss.item(), REF["losses"][0], "bf16 loss vs fp32", tol=5e-2)
    accelerator.backward(loss)
    expect(
        all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters()),
        "bf16: master shards not fp32",
    )

    # fp16: a sharded grad scaler that agrees across processes.
    accelerator = Accelerator(fsdp_plugin=plugin(), mixed_precision="fp16")
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    expect(isinstance(accelerator.scaler, ShardedGradScaler), f"fp16: scaler is {type(accelerator.scaler)}")
    model = make_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        accelerator.backward(nn.functional.mse_loss(model(xl), yl))
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    skipped = [None, None]
    dist.all_gather_object(skipped, (accelerator.scaler.get_scale(), accelerator.optimizer_step_was_skipped))
    expect(skipped[0] == skipped[1], f"fp16: processes disagree on the scaler: {skipped}")


class Gained(Net):
    """A tensor of the root module's own, which no reset_parameters, init_weights or param_init_fn sets."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(4))


@check
def bad_settings_fail_on_every_rank() -> None:
    # fp8 composes with FSDP2 (accel-fp8, tests/fp8); FSDP1's flat parameters cannot hold its layers.
    try:
        Accelerator(fsdp_plugin=plugin(fsdp_version=1), mixed_precision="fp8")
    except ValueError as error:
        expect("fsdp_version=2" in str(error), f"fp8 error message: {error}")
    else:
        expect(False, "fp8 with FSDP1 should be refused")
    accelerator = Accelerator(fsdp_plugin=plugin(fsdp_version=1))
    model = accelerator.prepare(make_net())
    try:
        accelerator.clip_grad_norm_(list(model.parameters())[:2], 1.0)
    except ValueError as error:
        expect("model.parameters()" in str(error), f"FSDP1 partial clip message: {error}")
    else:
        expect(False, "FSDP1 partial clip should be refused")
    try:
        FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Missing"])
        Accelerator(fsdp_plugin=plugin(transformer_cls_names_to_wrap=["Missing"])).prepare(make_net())
    except ValueError as error:
        expect("Missing" in str(error), f"missing class message: {error}")
    else:
        expect(False, "an unknown layer class should be refused")
    # A meta-device model holding tensors nothing can initialise is refused by name, on both processes alike.
    accelerator = Accelerator(fsdp_plugin=plugin())
    with torch.device("meta"):
        model = Gained()
    try:
        accelerator.prepare(model)
    except ValueError as error:
        expect(
            str(error).startswith("Gained was built") and "<root> (Gained)" in str(error),
            f"uninitialisable meta model message: {error}",
        )
    else:
        expect(False, "a meta model with a module nothing initialises should be refused")
    # A model on the meta device on one process only fails on both, instead of hanging.
    accelerator = Accelerator(fsdp_plugin=plugin())
    if rank == 0:  # (process 0 alone real is cpu_ram_efficient_loading; process 0 alone meta is a mistake)
        with torch.device("meta"):
            model = Net()
    else:
        model = make_net()
    try:
        accelerator.prepare(model)
    except ValueError as error:
        expect("meta device on processes [0]" in str(error), f"meta mismatch message: {error}")
    else:
        expect(False, "a meta model on one process only should be refused")


if __name__ == "__main__":
    run_checks()
