"""accel-fsdp checkpoint checks in one 2-process launch (gloo, CPU).

Run with the strategy chosen by the environment, as ``accel launch --use-fsdp`` does:
    ACCEL_STRATEGY=fsdp ACCEL_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP=Block \
        PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/fsdp/checkpoint_checks.py <tmp_dir>
Writes <tmp_dir>/ckpt (sharded), <tmp_dir>/export (save_model) and <tmp_dir>/expected.pt for
single_process_checks.py. Each ``@check`` is one test of test_fsdp_multiprocess.py (the harness:
tests/harness/checklist.py); later checks use what earlier ones trained, kept in ``RUNS``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from fsdp_testlib import LR, Net, data, local, make_net, param_groups
from torch import nn

from accel_core import Accelerator
from accel_fsdp import FSDPStrategy, FullyShardedDataParallelPlugin

TMP = Path(sys.argv[1])
PROBE = torch.randn(6, 8, generator=torch.Generator().manual_seed(5))


def new_accelerator(**plugin_kwargs) -> Accelerator:
    if not plugin_kwargs:
        return Accelerator()  # strategy and plugin from ACCEL_STRATEGY / ACCEL_FSDP_*
    return Accelerator(
        fsdp_plugin=FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"], **plugin_kwargs)
    )


acc = new_accelerator()
rank, world = acc.process_index, acc.num_processes
RUNS: dict[str, dict] = {}  # each round trip's results, for the checks after it


def setup(accelerator: Accelerator, seed: int):
    model = make_net(seed)
    optimizer = torch.optim.AdamW(param_groups(model), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return accelerator.prepare(model, optimizer, scheduler)


def train(accelerator: Accelerator, model, optimizer, scheduler, steps: range) -> list[float]:
    losses = []
    for step in steps:
        x, y = data(step)
        loss = nn.functional.mse_loss(model(local(x, rank, world)), local(y, rank, world))
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def probe(model) -> torch.Tensor:
    with torch.no_grad():
        return model(PROBE).detach().clone()


def global_mean(values: list[float]) -> list[float]:
    gathered = [None] * world
    dist.all_gather_object(gathered, values)
    return [sum(v[i] for v in gathered) / world for i in range(len(values))]


def round_trip(accelerator_factory, folder: Path, what: str, first: range, then: range) -> dict:
    """Train, save, go on (the uninterrupted run); then fresh objects, load, go on: same outputs and losses."""
    accelerator = accelerator_factory()
    model, optimizer, scheduler = setup(accelerator, seed=0)
    train(accelerator, model, optimizer, scheduler, first)
    saved_out = probe(model)  # a forward without backward first: SHARD_GRAD_OP units stay gathered
    accelerator.save_state(folder)
    expect(torch.equal(probe(model), saved_out), f"{what}: saving changed the model")
    straight = train(accelerator, model, optimizer, scheduler, then)
    straight_out = probe(model)

    resumed_acc = accelerator_factory()
    model2, optimizer2, scheduler2 = setup(resumed_acc, seed=123)
    expect(not torch.equal(probe(model2), saved_out), f"{what}: a fresh model already gives the saved outputs")
    resumed_acc.load_state(folder)
    expect(torch.equal(probe(model2), saved_out), f"{what}: outputs after load_state differ")
    resumed = train(resumed_acc, model2, optimizer2, scheduler2, then)
    expect(resumed == straight, f"{what}: continued losses {resumed} != uninterrupted {straight}")
    expect(torch.equal(probe(model2), straight_out), f"{what}: weights after continued training differ")
    return {
        "model": model,
        "accelerator": accelerator,
        "saved_out": saved_out,
        "straight": straight,
        "straight_out": straight_out,
    }


@check
def the_environment_chooses_and_configures_fsdp() -> None:
    expect(isinstance(acc.strategy, FSDPStrategy), f"ACCEL_STRATEGY=fsdp gave {type(acc.strategy).__name__}")
    expect(
        acc.strategy.plugin.transformer_cls_names_to_wrap == ["Block"],
        "ACCEL_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP not read",
    )
    expect(acc.strategy.plugin.state_dict_type == "SHARDED_STATE_DICT", "default state_dict_type")


@check
def sharded_save_load_gives_identical_outputs_and_continuation() -> None:
    ckpt = TMP / "ckpt"
    reuse = iter([acc])  # the environment-configured accelerator first, then fresh ones like it
    result = round_trip(lambda: next(reuse, None) or new_accelerator(), ckpt, "sharded", range(0, 3), range(3, 6))
    RUNS["sharded"] = result
    shards = sorted(os.listdir(ckpt / "sharded" / "model_0"))
    expect(".metadata" in shards and "__0_0.distcp" in shards and "__1_0.distcp" in shards, f"DCP files: {shards}")
    sizes = [os.path.getsize(ckpt / "sharded" / "model_0" / f"__{r}_0.distcp") for r in range(2)]
    expect(abs(sizes[0] - sizes[1]) < 0.2 * max(sizes), f"each process should write half the weights: {sizes}")
    expect(
        not any(name.startswith("model") and name.endswith(".safetensors") for name in os.listdir(ckpt)),
        "a full model file was written",
    )


@check
def save_model_writes_weights_a_plain_module_loads() -> None:
    # Consolidated weights for a plain nn.Module (checked in the single-process script too).
    result = RUNS["sharded"]
    model, accelerator = result["model"], result["accelerator"]
    accelerator.save_model(model, TMP / "export")
    full = accelerator.get_state_dict(model)
    if rank == 0:
        from accel_checkpoint import load_model

        plain = Net()
        load_model(plain, str(TMP / "export"))
        expect(
            all(torch.equal(plain.state_dict()[k], full[k]) for k in full),
            "save_model: weights differ from get_state_dict",
        )
        expect(torch.equal(probe(plain), result["straight_out"]), "save_model: a plain module gives other outputs")
    expected = {
        "probe": PROBE,
        "saved_out": result["saved_out"],
        "continued_global_losses": global_mean(result["straight"]),
        "final_out": result["straight_out"],
    }
    if rank == 0:  # for single_process_checks.py
        torch.save(expected, TMP / "expected.pt")


@check
def full_state_dict_round_trips() -> None:
    # Model files gathered on process 0, optimizer gathered too; loads the same way.
    # (with SHARD_GRAD_OP, whose units keep their parameters gathered after a forward without backward)
    round_trip(
        lambda: new_accelerator(state_dict_type="FULL_STATE_DICT", sharding_strategy="SHARD_GRAD_OP"),
        TMP / "full",
        "full state dict",
        range(0, 2),
        range(2, 4),
    )
    names = os.listdir(TMP / "full")
    expect("model.safetensors" in names, f"FULL_STATE_DICT: no model.safetensors in {names}")
    expect(
        os.listdir(TMP / "full" / "sharded") == ["optimizer_0.bin"],
        f"FULL_STATE_DICT sharded/: {os.listdir(TMP / 'full' / 'sharded')}",
    )


@check
def a_sharded_async_save_returns_before_its_shards_are_written() -> None:
    # accel-fsdp hands its shards over; accel-checkpoint copies them to CPU memory before save_state returns and
    # writes them on its background thread. The writer is held at the shards until every process has looked.
    import threading

    import accel_checkpoint.writer as writer_module

    real_write, gate, held = writer_module.write_sharded_state, threading.Event(), []

    def held_write(*args, **kwargs):
        held.append(threading.current_thread().name)
        gate.wait(timeout=120)
        return real_write(*args, **kwargs)

    writer_module.write_sharded_state = held_write
    try:
        accelerator = new_accelerator()
        model, optimizer, scheduler = setup(accelerator, seed=0)
        train(accelerator, model, optimizer, scheduler, range(0, 2))
        saved_out = probe(model)
        folder = TMP / "async"
        returned = accelerator.save_state(folder, async_save=True)
        writers = [t for t in threading.enumerate() if t.name == "accel-checkpoint-writer" and t.is_alive()]
        shards = [p for p in TMP.glob(".async*/sharded/**/*") if p.suffix == ".distcp" or p.name == ".metadata"]
        expect(len(writers) == 1, f"no checkpoint writer still running when save_state returned: {writers}")
        expect(
            returned == str(folder) and not folder.exists(), f"the async save completed before returning: {returned}"
        )
        expect(shards == [], f"shards on disk when save_state(async_save=True) returned: {shards}")
        train(accelerator, model, optimizer, scheduler, range(2, 3))  # changes the weights the snapshot holds
        dist.barrier()  # every process has looked before any writes its shards
    finally:
        gate.set()
        writer_module.write_sharded_state = real_write
    expect(accelerator.wait_for_checkpoint() == str(folder), "wait_for_checkpoint did not return the folder")
    expect(held and held[0] == "accel-checkpoint-writer", f"the shards were written on {held}, not the writer thread")
    written = sorted(os.listdir(folder / "sharded" / "model_0"))
    expect(f"__{rank}_0.distcp" in written and ".metadata" in written, f"DCP files after the wait: {written}")
    resumed = new_accelerator()
    model2, _optimizer2, _scheduler2 = setup(resumed, seed=123)
    resumed.load_state(folder)
    expect(torch.equal(probe(model2), saved_out), "the async checkpoint does not hold the weights at save time")


@check
def fsdp1_sharded_checkpoints_round_trip() -> None:
    round_trip(lambda: new_accelerator(fsdp_version=1), TMP / "fsdp1", "FSDP1 sharded", range(0, 2), range(2, 4))


def files_round_trip(accelerator_factory, folder: Path, what: str, use_dcp: bool = True) -> list[str]:
    """transformers' Trainer checkpoint: save_fsdp_model / save_fsdp_optimizer (the scheduler as the Trainer saves
    it), then fresh objects, load_fsdp_model / load_fsdp_optimizer: same outputs and continuation."""
    from accel.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    accelerator = accelerator_factory()
    plugin = accelerator.state.fsdp_plugin
    model, optimizer, scheduler = setup(accelerator, seed=0)
    train(accelerator, model, optimizer, scheduler, range(0, 2))
    saved_out = probe(model)
    save_fsdp_model(plugin, accelerator, model, folder, use_dcp=use_dcp)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder, use_dcp=use_dcp)
    scheduler_state = scheduler.state_dict()
    straight = train(accelerator, model, optimizer, scheduler, range(2, 4))

    resumed_acc = accelerator_factory()
    model2, optimizer2, scheduler2 = setup(resumed_acc, seed=123)
    expect(not torch.equal(probe(model2), saved_out), f"{what}: a fresh model already gives the saved outputs")
    load_fsdp_model(resumed_acc.state.fsdp_plugin, resumed_acc, model2, folder, use_dcp=use_dcp)
    expect(torch.equal(probe(model2), saved_out), f"{what}: outputs after load_fsdp_model differ")
    load_fsdp_optimizer(resumed_acc.state.fsdp_plugin, resumed_acc, optimizer2, model2, folder, use_dcp=use_dcp)
    scheduler2.load_state_dict(scheduler_state)
    resumed = train(resumed_acc, model2, optimizer2, scheduler2, range(2, 4))
    expect(resumed == straight, f"{what}: continued losses {resumed} != uninterrupted {straight}")
    return sorted(os.listdir(folder))


@check
def trainer_fsdp_files_round_trip() -> None:
    """accel.utils.save_fsdp_model & co, in the layouts of Accelerate's (the names a Trainer looks for on resume)."""
    sharded = files_round_trip(new_accelerator, TMP / "trainer_sharded", "save_fsdp_model sharded")
    expect(sharded == ["optimizer_0", "pytorch_model_fsdp_0"], f"sharded files: {sharded}")
    shards = sorted(os.listdir(TMP / "trainer_sharded" / "pytorch_model_fsdp_0"))
    expect(shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], f"each process writes its shard: {shards}")
    per_rank = files_round_trip(new_accelerator, TMP / "trainer_rank", "save_fsdp_model per rank", use_dcp=False)
    expect(
        per_rank == [f"{kind}_0_rank{r}.bin" for kind in ("optimizer", "pytorch_model_fsdp") for r in range(2)],
        f"per-rank files: {per_rank}",
    )
    full = files_round_trip(
        lambda: new_accelerator(state_dict_type="FULL_STATE_DICT"), TMP / "trainer_full", "save_fsdp_model full"
    )
    expect(full == ["optimizer.bin", "pytorch_model_fsdp.bin"], f"full files: {full}")
    if rank == 0:  # the whole model in one file, loadable by a plain module
        plain = Net()
        plain.load_state_dict(torch.load(TMP / "trainer_full" / "pytorch_model_fsdp.bin", weights_only=True))
    fsdp1 = files_round_trip(lambda: new_accelerator(fsdp_version=1), TMP / "trainer_fsdp1", "save_fsdp_model FSDP1")
    expect(fsdp1 == ["optimizer_0", "pytorch_model_fsdp_0"], f"FSDP1 sharded files: {fsdp1}")


if __name__ == "__main__":
    run_checks()
