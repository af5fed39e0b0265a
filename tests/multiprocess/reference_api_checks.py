"""Accelerator API that Accelerate scripts use, on 2 processes, written as a user writes it (only the import changed).

Covers: gradient_accumulation_steps set after construction, kwargs_handlers with a handler accel does
not apply, AcceleratorState._reset_state, reduce defaults and reductions, set_trigger /
check_trigger, trigger_sync_in_backward, profile, unwrap_model(keep_torch_compile=), setup
properties, DDP communication hooks (fp16, bf16, power-SGD), join_uneven_inputs with an iterable loader,
prepare_model(evaluation_mode=True).
Argument: a folder for the profiler traces. Each ``@check`` is one test of tests/core/test_reference_api.py (the
harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import dataclass
from unittest.mock import Mock

import torch
from checklist import check, expect, run_checks
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from accel import Accelerator, AcceleratorState, DistributedDataParallelKwargs, GradientState, PartialState
from accel.utils import (
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedType,
    KwargsHandler,
    ProfileKwargs,
    reduce,
)

rank = int(os.environ["RANK"])
OUT = sys.argv[1]


def fresh(**kwargs) -> Accelerator:
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(**kwargs)


def model_and_data(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    return model, x, y


@check
def gradient_accumulation_steps_setter() -> None:
    accelerator = fresh()
    accelerator.gradient_accumulation_steps = 2  # as find_executable_batch_size scripts do
    expect(accelerator.gradient_accumulation_steps == 2, "the setter sets it")
    model, x, y = model_and_data()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    syncs = []
    for i in range(4):
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x[i * 4 : i * 4 + 4]), y[i * 4 : i * 4 + 4]))
            syncs.append(accelerator.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
    expect(syncs == [False, True, False, True], f"accumulation follows the new value: {syncs}")
    try:
        accelerator.gradient_accumulation_steps = 0
        expect(False, "gradient_accumulation_steps = 0 must raise")
    except ValueError:
        pass


@dataclass
class SomeOtherKwargs(KwargsHandler):
    """A handler type accel does not apply (like Accelerate's TERecipeKwargs)."""

    level: int = 1


@check
def kwargs_handlers_and_reset_state() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = fresh(kwargs_handlers=[ProfileKwargs(record_shapes=True), SomeOtherKwargs(level=2)])
    messages = [str(w.message) for w in caught]
    expect(
        any("SomeOtherKwargs" in m and "ignored" in m for m in messages),
        f"an unknown handler is warned about: {messages}",
    )
    expect(not any("ProfileKwargs" in m.split(" (")[0] for m in messages), f"ProfileKwargs is known: {messages}")
    expect(accelerator.profile_handler.record_shapes, "ProfileKwargs is applied (profile_handler)")

    before = (PartialState().device, PartialState().process_index, PartialState().backend)
    AcceleratorState._reset_state()
    expect(PartialState().initialized, "AcceleratorState._reset_state() keeps the process state")
    expect(
        (PartialState().device, PartialState().process_index, PartialState().backend) == before, "same process state"
    )
    expect(fresh(mixed_precision="bf16").mixed_precision == "bf16", "a new Accelerator after the reset")


@check
def reduce_defaults_and_reductions() -> None:
    accelerator = fresh()
    value = torch.tensor([1.0 + rank, 10.0 * (rank + 1)])
    expect(reduce(value).tolist() == [1.5, 15.0], f"accel.utils.reduce averages by default: {reduce(value)}")
    expect(accelerator.reduce(value).tolist() == [3.0, 30.0], "Accelerator.reduce sums by default")
    expect(accelerator.reduce(value, reduction="max").tolist() == [2.0, 20.0], "max")
    expect(accelerator.reduce(value, reduction="min").tolist() == [1.0, 10.0], "min")
    expect(accelerator.reduce(value, reduction="product").tolist() == [2.0, 200.0], "product")
    expect(reduce({"a": value}, reduction="none")["a"].tolist() == value.tolist(), "none")
    try:
        accelerator.reduce(value, reduction="median")
        expect(False, "an unknown reduction must raise")
    except ValueError as error:
        expect("max" in str(error), f"the error lists the reductions: {error}")


@check
def triggers() -> None:
    accelerator = fresh()
    expect(not accelerator.check_trigger(), "no trigger set yet")
    if rank == 1:
        accelerator.set_trigger()  # only one process
    expect(accelerator.check_trigger(), "every process sees the trigger of process 1")
    expect(not accelerator.check_trigger(), "the trigger is lowered after the check")
    stopped_at = None
    for step in range(10):  # the early-stopping pattern
        if rank == 0 and step == 3:
            accelerator.set_trigger()
        if accelerator.check_trigger():
            stopped_at = step
            break
    expect(stopped_at == 3, f"both processes stop at step 3, got {stopped_at}")


@check
def trigger_sync_in_backward() -> None:
    accelerator = fresh()
    model, x, y = model_and_data()
    model = accelerator.prepare(model)
    with accelerator.no_sync(model):
        loss_a = torch.nn.functional.mse_loss(model(x[:8]), y[:8])
        loss_b = torch.nn.functional.mse_loss(model(x[8:]), y[8:])
    accelerator.backward(loss_a)
    local_a = [p.grad.clone() for p in model.parameters()]
    everyone = accelerator.gather(local_a[0].flatten()[None])
    expect(not torch.allclose(everyone[0], everyone[1]), "loss_a's gradients stay local")
    with accelerator.trigger_sync_in_backward(model):
        accelerator.backward(loss_b)
    # Expected: the mean over ranks of each rank's local grad(a) + grad(b).
    reference, _, _ = model_and_data()
    reference.load_state_dict(accelerator.unwrap_model(model).state_dict())
    (
        torch.nn.functional.mse_loss(reference(x[:8]), y[:8]) + torch.nn.functional.mse_loss(reference(x[8:]), y[8:])
    ).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        mean = accelerator.reduce(q.grad.clone(), reduction="mean")
        expect(
            torch.allclose(p.grad, mean, atol=1e-6),
            f"synced gradients are the mean of local sums ({(p.grad - mean).abs().max()})",
        )
    expect(model.require_backward_grad_sync, "the block restores DDP's flags")


@check
def profile() -> None:
    trace_dir = os.path.join(OUT, "traces")
    accelerator = fresh(kwargs_handlers=[ProfileKwargs(activities=["cpu"], output_trace_dir=trace_dir)])
    model, x, _ = model_and_data()
    with accelerator.profile() as prof:
        model(x).sum().backward()
    expect(any("aten::addmm" in e.key for e in prof.key_averages()), "the profiler recorded the matmuls")
    for r in range(2):  # written by each process; wait_for_everyone inside profile()
        path = os.path.join(trace_dir, f"profile_{r}.json")
        expect(os.path.isfile(path), f"{path} written")
        if os.path.isfile(path):
            with open(path) as handle:
                expect("traceEvents" in json.load(handle), f"{path} is a Chrome trace")
    scheduled = []
    handler = ProfileKwargs(
        schedule_option={"wait": 1, "warmup": 1, "active": 1}, on_trace_ready=lambda p: scheduled.append(1)
    )
    with accelerator.profile(handler) as prof:
        for _ in range(4):
            model(x).sum()
            prof.step()
    expect(scheduled == [1], f"a scheduled profile calls on_trace_ready once per cycle: {scheduled}")
    try:
        ProfileKwargs(activities=["gpu"]).build()
        expect(False, "an unknown activity must raise")
    except ValueError as error:
        expect("cpu" in str(error), f"names the activities: {error}")


@check
def properties_and_unwrap() -> None:
    accelerator = fresh(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=True))
    expect(accelerator.use_seedable_sampler and accelerator.non_blocking, "dataloader settings read back")
    expect(not accelerator.is_fsdp2 and accelerator.deepspeed_plugin is None, "DDP run: not FSDP2, no DeepSpeed plugin")
    expect(not accelerator.multi_device, "CPU processes are not multi_device (as in Accelerate)")
    expect(accelerator.should_save_model == (rank == 0), "should_save_model: the first process of the machine")
    expect(accelerator.ddp_handler is None, "no ddp handler given")
    model, x, _ = model_and_data()
    prepared = accelerator.prepare(model)
    compiled = torch.compile(prepared, backend="eager")
    kept = accelerator.unwrap_model(compiled)
    expect(
        isinstance(kept, torch._dynamo.eval_frame.OptimizedModule),
        f"keep_torch_compile=True keeps it compiled: {type(kept)}",
    )
    expect(
        kept._orig_mod is model and kept.dynamo_ctx is compiled.dynamo_ctx, "...around the user's module, same backend"
    )
    plain = accelerator.unwrap_model(compiled, keep_torch_compile=False)
    expect(plain is model, "keep_torch_compile=False gives the user's module")
    expect(
        isinstance(compiled._orig_mod, torch.nn.parallel.DistributedDataParallel),
        "unwrapping leaves the prepared model alone",
    )
    expect(torch.allclose(kept(x), model(x)), "the kept compiled module computes the model")


def train_with_hook(handler: DistributedDataParallelKwargs | None, steps: int = 1, lr: float = 0.0):
    accelerator = fresh(kwargs_handlers=[handler] if handler is not None else None)
    model, x, y = model_and_data()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=lr))
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
    return grads, losses


@check
def ddp_comm_hooks() -> None:
    exact, _ = train_with_hook(None)
    for kind, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        compressed, _ = train_with_hook(DistributedDataParallelKwargs(comm_hook=kind))
        for e, c in zip(exact, compressed, strict=True):
            # The hook sends each rank's gradient / world size in `dtype`: the result is the exact mean
            # up to that dtype's rounding of the two halves, and not bit-identical to it.
            tolerance = 4 * float(torch.finfo(dtype).eps) * float(e.abs().max())
            expect(
                torch.allclose(e, c, atol=tolerance, rtol=0),
                f"{kind}: within rounding ({(e - c).abs().max()} > {tolerance})",
            )
        expect(
            any(not torch.equal(e, c) for e, c in zip(exact, compressed, strict=True)),
            f"{kind}: the gradients went through {kind}",
        )
    power = DistributedDataParallelKwargs(
        comm_hook=DDPCommunicationHookType.POWER_SGD,
        comm_wrapper=DDPCommunicationHookType.FP16,
        comm_state_option={"matrix_approximation_rank": 1, "start_powerSGD_iter": 2},
    )
    grads, losses = train_with_hook(power, steps=30, lr=0.2)
    exact_grads, _exact_losses = train_with_hook(None, steps=30, lr=0.2)
    expect(losses[-1] < 0.7 * losses[0], f"power-SGD trains: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    expect(
        any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, exact_grads, strict=True)),
        "power-SGD approximates (rank 1)",
    )
    everyone = PartialState()
    same = torch.cat([g.flatten() for g in grads])
    gathered = [torch.zeros_like(same) for _ in range(everyone.num_processes)]
    torch.distributed.all_gather(gathered, same)
    expect(torch.equal(gathered[0], gathered[1]), "power-SGD gradients agree across ranks")
    # Batched power-SGD is registered; it is not run: torch 2.15's batched_powerSGD_hook hands a 2-d
    # matrix to its own _orthogonalize, which asserts 3-d (an AssertionError in torch, Accelerate alike).
    accelerator = fresh(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="batched_power_sgd")])
    model = accelerator.prepare(model_and_data()[0])
    hooks = [(getattr(hook, "__name__", ""), type(state).__name__) for hook, state in model._comm_hooks]
    expect(hooks == [("batched_powerSGD_hook", "PowerSGDState")], f"batched power-SGD registered: {hooks}")


class Stream(IterableDataset):
    def __iter__(self):
        yield from (torch.tensor([float(i)]) for i in range(10))


@check
def join_with_iterable_loader() -> None:
    accelerator = fresh()
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    iterable = accelerator.prepare(DataLoader(Stream(), batch_size=2))
    mapped = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10.0)), batch_size=2))
    iterable_before, mapped_before = iterable.even_batches, mapped.even_batches
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            expect(iterable.even_batches == iterable_before, "an iterable loader's even_batches is not overridden")
            expect(mapped.even_batches is False, "a map-style loader's even_batches is overridden")
    messages = [str(w.message) for w in caught]
    expect(
        any("only supported for map-style datasets" in m for m in messages), f"the override is warned about: {messages}"
    )
    expect(mapped.even_batches == mapped_before, "restored after the block")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model, torch.nn.Linear(1, 1)]):
            pass
    messages = [str(w.message) for w in caught]
    expect(
        any(
            "Linear (position 1) passed to it is not torch Joinable" in m and "model accelerator.prepare returned" in m
            for m in messages
        )
        and not any("strategy's are" in m for m in messages),
        f"a join of an object that cannot join names that object: {messages}",
    )


@check
def join_of_a_non_ddp_object_warns_in_the_reference_words() -> None:
    # Accelerate's test_distributed_data_loop: the distributed type set to FSDP, a Mock joined, and the last
    # warning must be a UserWarning saying "only supported for multi-GPU".
    accelerator = fresh()
    original = accelerator.state.distributed_type
    accelerator.state.distributed_type = DistributedType.FSDP
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with accelerator.join_uneven_inputs([Mock()]):
                pass
    finally:
        accelerator.state.distributed_type = original
    last = caught[-1] if caught else None
    expect(last is not None and issubclass(last.category, UserWarning), f"a UserWarning: {caught}")
    message = str(last.message) if last is not None else ""
    expect("only supported for multi-GPU" in message, f"the reference's words: {message}")
    expect("Mock (position 0) passed to it is not torch Joinable" in message, f"names what was passed: {message}")


class Generator(torch.nn.Module):
    """A model with buffers (BatchNorm) and a method of its own, as a transformers model has ``generate``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.seen: list[torch.dtype] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x)
        self.seen.append(hidden.dtype)
        return self.norm(hidden)

    def generate(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).argmax(-1)


@check
def prepare_model_evaluation_mode() -> None:
    # TRL's frozen reference model: as in Accelerate, it is not wrapped in DDP (its generate stays reachable, and a
    # forward on the main process alone does not wait for the other's DDP buffer broadcast), but autocast applies.
    accelerator = fresh(mixed_precision="bf16")
    model = Generator()
    prepared = accelerator.prepare_model(model, evaluation_mode=True)
    expect(prepared is model, f"evaluation_mode=True returns the user's module, not {type(prepared).__name__}")
    expect(any(m is model for m in accelerator._models), "registered, as in Accelerate")
    if accelerator.is_main_process:  # sampling on the main process only, for logging
        with torch.no_grad():
            prepared.eval()
            expect(prepared.generate(torch.ones(2, 4)).shape == (2,), "generate on the main process alone")
    accelerator.wait_for_everyone()
    with torch.no_grad():
        prepared(torch.ones(2, 4))
    expect(model.seen[-1] == torch.bfloat16, f"mixed precision applies: the forward ran in {model.seen[-1]}")
    trained = accelerator.prepare_model(torch.nn.Linear(4, 4))
    expect(isinstance(trained, torch.nn.parallel.DistributedDataParallel), "without evaluation_mode: DDP")


if __name__ == "__main__":
    run_checks()
