"""DeepSpeed started by plain `python` (a group of one): the contradictory-config errors, Dummy objects,
a frozen teacher next to a ZeRO-3 student with a checkpoint round trip.

Run: PYTHONPATH=tests/harness python tests/deepspeed/single_process_checks.py <tmp_dir>
Each ``@check`` is one test of test_deepspeed_runs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import gc
import json
import logging
import sys
import weakref
from collections.abc import Callable
from pathlib import Path

import ds_testlib as T
import torch
import torch.distributed as dist
import torch.nn.functional as F
from checklist import check, expect, run_checks

from accel_core import Accelerator, DistributedType
from accel_deepspeed import DeepSpeedPlugin, DummyOptim, DummyScheduler
from accel_deepspeed.wrappers import DeepSpeedSchedulerWrapper

TMP = Path(sys.argv[1])
FIGURES: dict[str, object] = {}


def loader(dataset=None) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset or T.regression_data(), batch_size=T.BATCH)


def config(**sections) -> dict:
    base = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    base.update(sections)
    return base


ADAMW = {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}
WARMUP = {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}}


def expect_error(build: Callable[[], Accelerator | None], action: Callable[[Accelerator], object], needle: str) -> None:
    """``action`` must raise ValueError containing ``needle``, before any DeepSpeed engine exists."""
    accelerator = build()
    try:
        action(accelerator)
    except ValueError as error:
        expect(needle in str(error), f"expected {needle!r} in: {error}")
        expect(accelerator.strategy.engine is None, f"an engine was built before the error {needle!r}")
    else:
        raise AssertionError(f"no error for: {needle}")


@check
def plain_python_start() -> None:
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    expect(accelerator.num_processes == 1 and dist.is_initialized() and dist.get_world_size() == 1, "a group of one")
    expect(accelerator.distributed_type == DistributedType.DEEPSPEED, f"{accelerator.distributed_type}")
    model = T.mlp()
    engine, optimizer, data = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=T.LR), loader())
    losses, batches = T.train_accel(accelerator, engine, optimizer, data, max_batches=4)
    reference = T.mlp()
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=T.LR)
    expected = []
    for batch in batches:
        loss = T.regression_loss(reference, batch)
        loss.backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        expected.append(loss.item())
    expect(T.close(losses, expected, 1e-5, 1e-6), f"one-process ZeRO-2 {losses} vs plain torch {expected}")
    state = accelerator.get_state_dict(engine)
    expect(all(torch.equal(state[k], v) for k, v in reference.state_dict().items()), "get_state_dict under ZeRO-2")
    accelerator.end_training()  # closes the trackers only: the engine stays (scripts save the model after it)
    expect(accelerator.strategy.engine is engine, "end_training() kept the engine")
    # free_memory() tears the strategy down (DeepSpeed's destroy()) and keeps no reference: once the script drops its
    # own (the engine, its optimizer, and the model, which DeepSpeed's module hooks tie to the engine), both are freed.
    zero_optimizer = weakref.ref(engine.optimizer)
    old_engine = weakref.ref(engine)
    accelerator.free_memory()
    expect(accelerator.strategy.engine is None and accelerator._models == [], "free_memory() released the engine")
    del engine, optimizer, state, model
    gc.collect()
    expect(old_engine() is None and zero_optimizer() is None, "the engine and ZeRO's optimizer outlived free_memory()")
    accelerator.strategy.teardown()  # a second teardown (as at exit after free_memory) finds nothing to release
    model2 = T.mlp(5)
    engine2, _, _ = accelerator.prepare(model2, torch.optim.AdamW(model2.parameters(), lr=T.LR), loader())
    expect(accelerator._models == [engine2], "a new engine after free_memory()")
    try:
        accelerator.clip_grad_value_(engine2.parameters(), 1.0)
    except ValueError as error:
        expect("clip_grad_norm_" in str(error), str(error))
    else:
        raise AssertionError("clip_grad_value_ must be refused")


@check
def errors() -> None:
    def acc(**plugin_kwargs) -> Callable[[], Accelerator]:
        return lambda: Accelerator(deepspeed_plugin=DeepSpeedPlugin(**plugin_kwargs))

    def with_model(extra: Callable[[torch.nn.Module], list]) -> Callable[[Accelerator], object]:
        def action(accelerator: Accelerator) -> object:
            model = T.mlp()
            return accelerator.prepare(model, *extra(model), loader())

        return action

    adam = lambda m: torch.optim.AdamW(m.parameters(), lr=T.LR)  # noqa: E731
    expect_error(
        acc(hf_ds_config=config(optimizer=ADAMW)),
        with_model(lambda m: [adam(m)]),
        "You cannot specify an optimizer in the config file and in the code at the same time",
    )
    expect_error(
        acc(),
        with_model(lambda m: [DummyOptim(m.parameters())]),
        "You cannot create a `DummyOptim` without specifying an optimizer in the config file",
    )
    expect_error(
        acc(hf_ds_config=config(scheduler=WARMUP)),
        with_model(lambda m: [o := adam(m), torch.optim.lr_scheduler.StepLR(o, 1)]),
        "You cannot specify a scheduler in the config file and in the code at the same time",
    )
    expect_error(
        acc(),
        with_model(lambda m: [o := adam(m), DummyScheduler(o)]),
        "You cannot create a `DummyScheduler` without specifying a scheduler in the config file",
    )
    expect_error(
        acc(hf_ds_config=config(optimizer=ADAMW)),
        with_model(lambda m: [DummyOptim(m.parameters()), torch.optim.lr_scheduler.StepLR(adam(m), 1)]),
        "You can only specify `accel_deepspeed.DummyScheduler` in the code when using `accel_deepspeed.DummyOptim`",
    )

    def gan(accelerator: Accelerator) -> object:
        generator, discriminator = T.mlp(1), T.mlp(2)
        return accelerator.prepare(generator, discriminator, adam(generator), adam(discriminator), loader())

    expect_error(acc(), gan, "a DeepSpeed engine has one of each")

    def two_trainable(accelerator: Accelerator) -> object:
        student, other = T.mlp(1), T.mlp(2)
        return accelerator.prepare(student, other, adam(student), loader())

    expect_error(acc(), two_trainable, "with multiple models when using DeepSpeed")
    expect_error(acc(), lambda a: a.prepare(T.mlp(), adam(T.mlp())), "belong to none of the models")
    expect_error(
        acc(), lambda a: a.prepare(adam(T.mlp())), "pass the model, optimizer and scheduler to the same prepare() call"
    )
    expect_error(
        acc(),
        lambda a: a.prepare((m := T.mlp()), adam(m)),
        "requires you to pass at least one of training or evaluation dataloaders",
    )
    expect_error(acc(), lambda a: a.prepare_model(T.mlp()), "pass the model to accelerator.prepare()")
    settled = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config(bf16={"enabled": True})))
    expect(
        settled.mixed_precision == "bf16",
        f"the DeepSpeed config's bf16 is reported before prepare: {settled.mixed_precision}",
    )
    try:
        Accelerator(
            deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config(bf16={"enabled": True})), mixed_precision="fp16"
        )
    except ValueError as error:
        expect("cannot be set to `fp16` when `bf16` is set in the DeepSpeed config" in str(error), str(error))
    else:
        raise AssertionError("fp16 with a bf16 DeepSpeed config must be refused")
    try:
        Accelerator(deepspeed_plugin=torch.nn.Linear(1, 1))
    except TypeError as error:
        expect("DeepSpeedPlugin" in str(error), str(error))
    else:
        raise AssertionError("a deepspeed_plugin of the wrong type must be refused")


@check
def dummy_objects_and_accumulation() -> None:
    plugin = DeepSpeedPlugin(hf_ds_config=config(optimizer=ADAMW, scheduler=WARMUP, zero_optimization={"stage": 1}))
    accelerator = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=2)
    model = T.mlp()
    optimizer = DummyOptim(model.parameters(), lr=0.05, weight_decay=0.0)
    scheduler = DummyScheduler(optimizer, warmup_num_steps=10)
    engine, optimizer, data, scheduler = accelerator.prepare(model, optimizer, loader(), scheduler)
    filled = accelerator.strategy.deepspeed_config
    expect(
        filled["optimizer"]["params"]["lr"] == 0.05 and filled["scheduler"]["params"]["warmup_max_lr"] == 0.05,
        f"{filled}",
    )
    expect(
        filled["scheduler"]["params"]["warmup_num_steps"] == 10 and filled["gradient_accumulation_steps"] == 2,
        f"{filled}",
    )
    expect(
        isinstance(scheduler, DeepSpeedSchedulerWrapper) and accelerator.strategy.engine_owns_scheduler, f"{scheduler}"
    )
    lrs = []
    for i, batch in enumerate(data):
        if i == 6:
            break
        with accelerator.accumulate(engine):
            accelerator.backward(T.regression_loss(engine, batch))
            optimizer.step()
            scheduler.step()  # a no-op: the engine steps DeepSpeed's scheduler at each boundary
            optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    expect(
        engine.global_steps == 3, f"6 micro-steps with accumulation 2 are 3 optimizer steps, got {engine.global_steps}"
    )
    # WarmupLR (log warm-up from 0) moves once per optimizer step, i.e. only at every second micro-step.
    expect(lrs[0] == lrs[1] == lrs[2] == 0 < lrs[3] == lrs[4] < lrs[5], f"lr per micro-step {lrs}")
    FIGURES["warmup_lrs"] = [round(v, 6) for v in lrs]


@check
def deepspeed_scheduler_object() -> None:
    """A DeepSpeed LR schedule built in code (not a torch LRScheduler) is handed to the engine, which steps it."""
    from deepspeed.runtime.lr_schedules import WarmupLR

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    model = T.mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=T.LR)
    warmup = WarmupLR(optimizer, warmup_min_lr=0.0, warmup_max_lr=0.04, warmup_num_steps=10, warmup_type="linear")
    engine, optimizer, data, scheduler = accelerator.prepare(model, optimizer, loader(), warmup)
    expect(
        isinstance(scheduler, DeepSpeedSchedulerWrapper) and engine.lr_scheduler is warmup, "the engine owns WarmupLR"
    )
    T.train_accel(accelerator, engine, optimizer, data, scheduler=scheduler, max_batches=3)
    # DeepSpeed's schedules number the first step 0: after 3 optimizer steps, lr = 0.04 * 2 / 10.
    expect(
        abs(scheduler.get_last_lr()[0] - 0.04 * 2 / 10) < 1e-9,
        f"linear warm-up after 3 steps: {scheduler.get_last_lr()}",
    )


@check
def frozen_teacher_and_zero3_round_trip() -> None:
    def build(seed: int):
        plugin = DeepSpeedPlugin(zero_stage=3)
        accelerator = Accelerator(deepspeed_plugin=plugin)
        student, teacher = T.mlp(seed), T.mlp(seed + 1).requires_grad_(False)
        optimizer = torch.optim.AdamW(student.parameters(), lr=T.LR)
        engine, optimizer, data, teacher = accelerator.prepare(student, optimizer, loader(), teacher)
        return accelerator, engine, optimizer, data, teacher

    def step(accelerator, engine, optimizer, teacher, x) -> float:
        with torch.no_grad():
            target = teacher(x)
        loss = F.mse_loss(engine(x), target)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    accelerator, engine, optimizer, data, teacher = build(seed=0)
    expect(
        type(engine).__name__ == "DeepSpeedEngine" and type(teacher) is torch.nn.Sequential, "teacher stays a module"
    )
    expect(len(accelerator._models) == 2 and accelerator.strategy.frozen_models == [teacher], "both models registered")
    batches = [x for x, _ in data]
    for x in batches[:3]:
        step(accelerator, engine, optimizer, teacher, x)
    accelerator.save_state(TMP / "distill")
    after = [step(accelerator, engine, optimizer, teacher, x) for x in batches[3:6]]

    accelerator2, engine2, optimizer2, _, teacher2 = build(seed=10)  # other weights for both models
    accelerator2.load_state(TMP / "distill", load_dataloader_state=False)
    expect(
        all(
            torch.equal(a, b)
            for a, b in zip(teacher.state_dict().values(), teacher2.state_dict().values(), strict=True)
        ),
        "teacher restored",
    )
    resumed = [step(accelerator2, engine2, optimizer2, teacher2, x) for x in batches[3:6]]
    expect(resumed == after, f"ZeRO-3 continuation after load_state {resumed} vs {after}")
    globals_found = sorted(
        {
            g
            for f in (TMP / "distill" / "sharded" / "model_0").glob("*.pt")
            for g in torch.serialization.get_unsafe_globals_in_checkpoint(str(f))
        }
    )
    FIGURES["zero3_checkpoint_globals"] = globals_found


def print_figures() -> None:
    """The figures the test module reads, printed once every check has run."""
    print("FIGURES " + json.dumps(FIGURES), flush=True)


if __name__ == "__main__":
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    run_checks(teardown=print_figures)
