"""Run under ``torchrun --nproc_per_node 2`` by test_multiprocess.py.

mp_checkpoint.py full <dir>    train 2 epochs of shuffled data (dropout, accumulation), async-save
                               the state at step K while DDP training goes on, write the results.
mp_checkpoint.py resume <dir>  new processes: load the step-K checkpoint, finish the run, and
                               check it is bit-identical to the uninterrupted one; then: a file
                               missing on one process fails every process (no hang), a dataset
                               changed under the mid-epoch checkpoint is refused (or its epoch
                               restarted, ACCEL_DATA_CHANGED=restart_epoch), and sharded
                               (FSDP2 / DTensor) state through the DCP default and a strategy's
                               own ShardedCheckpointing, merge and save_model; the state hooks
                               get the user's modules (not DDP's wrapper).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from accel_checkpoint import DCPCheckpointing, merge_sharded_checkpoint
from accel_checkpoint.errors import CheckpointError, CheckpointNotFoundError
from accel_core import Accelerator, set_seed
from accel_core.configuration import ProjectConfiguration
from accel_core.strategies import Strategy

EPOCHS, K, ACCUMULATION = 2, 6, 2  # 8 micro-steps per epoch per process; K is an optimizer-step boundary


def build(project_dir: str):
    set_seed(42)
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=ACCUMULATION, project_config=ProjectConfiguration(project_dir=project_dir)
    )
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    # No explicit generator, as most scripts: torch draws each epoch's iterator base seed from the
    # global RNG (as with Accelerate); a resumed run's mid-epoch iterator replays that draw from the
    # loader's saved state, leaving the global torch RNG (and so dropout) where the uninterrupted run has it.
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return (accelerator, *accelerator.prepare(model, optimizer, loader, scheduler))


def run(accelerator, model, optimizer, loader, scheduler, start_step: int, save_dir: str | None):
    """Trains from ``start_step`` (micro-steps) to the end; returns the losses seen after step K."""
    losses = []
    step = start_step
    for _epoch in range(start_step // len(loader), EPOCHS):
        for x, y in loader:  # a resumed loader starts where the saved one stopped
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            step += 1
            if step > K:
                losses.append(loss.detach().clone())
            if step == K and save_dir is not None:
                # Async: DDP's all-reduces of the next steps run while the writer thread agrees
                # with the other process on its own gloo group.
                accelerator.save_state(save_dir, async_save=True)
    return torch.stack(losses)


def results(model, optimizer, losses):
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "losses": losses,
    }


def full(folder: str) -> None:
    from accel_checkpoint.coordination import Coordinator
    from accel_core.strategies import groups

    accelerator, model, optimizer, loader, scheduler = build(folder)
    # The coordinator's gloo group exists once the Accelerator is set up (on several machines a gloo network problem
    # shows in the first seconds, not at the first save), and the first save uses it instead of making one.
    made = groups._COORDINATION.get("group")  # the cache itself: asking coordination_group() would create it
    assert made is not None and dist.get_backend(made) == "gloo" and dist.get_world_size(made) == 2, made
    assert Coordinator().group is made
    losses = run(accelerator, model, optimizer, loader, scheduler, 0, os.path.join(folder, "step_k"))
    assert accelerator.wait_for_checkpoint() == os.path.join(folder, "step_k")  # joins the writer thread
    torch.save(results(model, optimizer, losses), os.path.join(folder, f"full_{accelerator.process_index}.pt"))
    accelerator.wait_for_everyone()
    assert sorted(os.listdir(os.path.join(folder, "step_k"))) == sorted(
        [
            "COMPLETE",
            "accel_checkpoint.json",
            "model.safetensors",
            "optimizer.bin",
            "scheduler.bin",
            "random_states_0.pt",
            "random_states_1.pt",
            "dataloader_0_rank_0.pt",
            "dataloader_0_rank_1.pt",
        ]
    )
    print(f"rank {accelerator.process_index}: full run OK", flush=True)


def equal(a, b, path="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), f"differs at {path}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            equal(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            equal(x, y, f"{path}/{i}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def resume(folder: str) -> None:
    accelerator, model, optimizer, loader, scheduler = build(folder)
    rank = accelerator.process_index
    accelerator.load_state(os.path.join(folder, "step_k"))
    losses = run(accelerator, model, optimizer, loader, scheduler, K, None)
    expected = torch.load(os.path.join(folder, f"full_{rank}.pt"), weights_only=True)
    equal(results(model, optimizer, losses), expected)  # weights, Adam moments, losses: bit-identical
    print(f"rank {rank}: exact resume OK ({len(losses)} steps after K)", flush=True)

    # A file missing on one process only: both processes raise, nothing is half-loaded, no hang.
    broken = os.path.join(folder, "broken")
    if rank == 0:
        shutil.copytree(os.path.join(folder, "step_k"), broken)
        os.remove(os.path.join(broken, "dataloader_0_rank_1.pt"))
    accelerator.wait_for_everyone()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        accelerator.load_state(broken)
    except CheckpointNotFoundError as error:
        assert rank == 1 and "dataloader_0_rank_1.pt" in str(error), error
    except CheckpointError as error:
        assert rank == 0 and "failed on process 1" in str(error) and "dataloader_0_rank_1.pt" in str(error), error
    else:
        raise AssertionError("loading a broken checkpoint did not fail")
    equal(model.state_dict(), before)
    print(f"rank {rank}: failure on one process fails all OK", flush=True)
    data_changed_checks(folder, accelerator, model, loader, rank)
    hook_checks(folder, accelerator, model, rank)
    sharded_checks(folder, rank)


def data_changed_checks(folder: str, accelerator: Accelerator, model, loader, rank: int) -> None:
    """step_k is mid-epoch (6 of 8 steps) over 64 samples: over 80 it is refused on both processes, nothing loaded;
    with ACCEL_DATA_CHANGED=restart_epoch the epoch restarts and reads each of 63 samples once (padding dropped)."""
    data = loader.dataset
    saved = data.tensors
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data.tensors = (torch.randn(80, 6), torch.randn(80, 1))
    try:
        accelerator.load_state(os.path.join(folder, "step_k"))
    except ValueError as error:
        assert "its data changed since the checkpoint (dataset length 64 -> 80)" in str(error), error
        assert "ACCEL_DATA_CHANGED=restart_epoch" in str(error), error
    else:
        raise AssertionError("resuming mid-epoch over a changed dataset was not refused")
    equal(model.state_dict(), before)
    assert loader.state_dict()["batches_yielded"] == 0  # the loader as it was (its run ended at an epoch's end)

    x = torch.arange(63, dtype=torch.float32).unsqueeze(1).repeat(1, 6)
    data.tensors = (x, torch.zeros(63, 1))
    os.environ["ACCEL_DATA_CHANGED"] = "restart_epoch"
    try:
        accelerator.load_state(os.path.join(folder, "step_k"))
    finally:
        del os.environ["ACCEL_DATA_CHANGED"]
    state = loader.state_dict()
    assert state["batches_yielded"] == 0 and state["epoch"] == 0 and state["dataset_length"] == 63, state
    seen = []
    for x_batch, _y in loader:
        seen += accelerator.gather_for_metrics(x_batch[:, 0].contiguous()).tolist()
    assert sorted(int(v) for v in seen) == list(range(63)), sorted(seen)
    data.tensors = saved
    print(f"rank {rank}: data changed refused OK", flush=True)


def hook_checks(folder: str, accelerator: Accelerator, model: torch.nn.Module, rank: int) -> None:
    """diffusers' save/load model hooks: as in the reference, they get the user's module, not its DDP wrapper (it
    calls the model's save_pretrained; plain state-dict keys), and ``_models`` lists it; a model the save hook
    saved itself (popping its weights) and the load hook loaded itself is not in the model files."""
    from torch.nn.parallel import DistributedDataParallel

    assert isinstance(model, DistributedDataParallel)
    inner = model.module
    seen: dict[str, list[torch.nn.Module]] = {}

    def save_model_hook(models, weights, output_dir):
        seen["save"] = list(models)
        assert [sorted(w) for w in weights] == [sorted(inner.state_dict())], [sorted(w) for w in weights]
        if accelerator.is_main_process:
            torch.save(models[0].state_dict(), os.path.join(output_dir, "unet.pt"))
        weights.pop()

    def load_model_hook(models, input_dir):
        seen["load"] = list(models)
        models.pop().load_state_dict(torch.load(os.path.join(input_dir, "unet.pt"), weights_only=True))

    handles = [
        accelerator.register_save_state_pre_hook(save_model_hook),
        accelerator.register_load_state_pre_hook(load_model_hook),
    ]
    target = os.path.join(folder, "hooks")
    accelerator.save_state(target)
    saved = torch.load(os.path.join(target, "unet.pt"), weights_only=True)
    assert sorted(saved) == sorted(inner.state_dict()), sorted(saved)  # no "module." prefix
    assert not os.path.exists(os.path.join(target, "model.safetensors"))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(target)
    equal(inner.state_dict(), saved)
    for handle in handles:
        handle.remove()
    assert [type(m).__name__ for m in seen["save"]] == ["Sequential"] and seen["save"][0] is inner, seen
    assert len(seen["load"]) == 1 and seen["load"][0] is inner, seen
    assert len(accelerator._models) == 1 and accelerator._models[0] is inner, accelerator._models
    print(f"rank {rank}: state hooks get the user's modules OK", flush=True)


class FullyShardStrategy(Strategy):
    """What an FSDP2 strategy's prepare produces: parameters sharded as DTensors (no checkpoint methods)."""

    name = "fully_shard_test"
    supported_precisions = ("no",)

    def prepare_model(self, model, device_placement):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        return fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))


class OwnCheckpointStrategy(FullyShardStrategy):
    """A strategy implementing ShardedCheckpointing (here by delegating to the DCP default, and counting)."""

    name = "own_checkpoint_test"
    calls: ClassVar[list[str]] = []

    def save_sharded(self, prepared, folder, **kwargs):
        self.calls.append("save")
        return DCPCheckpointing().save_sharded(prepared, folder)

    def load_sharded(self, prepared, folder, **kwargs):
        self.calls.append("load")
        DCPCheckpointing().load_sharded(prepared, folder, **kwargs)


def sharded_checks(folder: str, rank: int) -> None:
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    for strategy, expected_impl in ((FullyShardStrategy(), "dcp"), (OwnCheckpointStrategy(), "OwnCheckpointStrategy")):
        accelerator = Accelerator(cpu=True, strategy=strategy)
        torch.manual_seed(0)
        model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)))
        assert isinstance(model[0].weight, DTensor)
        optimizer = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=1e-2))
        for _ in range(2):
            model(torch.randn(3, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        target = os.path.join(folder, f"sharded_{strategy.name}")
        # As in the reference, a model the backend restores itself is not given to the load hooks.
        hooked: dict[str, list] = {}
        accelerator.register_save_state_pre_hook(lambda models, weights, _dir, seen=hooked: seen.update(save=models))
        accelerator.register_load_state_pre_hook(lambda models, _dir, seen=hooked: seen.update(load=list(models)))
        accelerator.save_state(target)
        import json

        with open(os.path.join(target, "accel_checkpoint.json")) as handle:
            meta = json.load(handle)
        assert meta["sharded"]["implementation"].endswith(expected_impl) and meta["sharded"]["covers"] == [
            "models",
            "optimizers",
        ]
        assert not os.path.exists(os.path.join(target, "model.safetensors"))
        shards = {k: v.to_local().clone() for k, v in model.state_dict().items()}
        moments = [v["exp_avg"].to_local().clone() for v in optimizer.optimizer.state.values()]
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().zero_()
            for state in optimizer.optimizer.state.values():
                state["exp_avg"].to_local().zero_()
        accelerator.load_state(target)
        assert len(hooked["save"]) == 1 and hooked["save"][0] is model and hooked["load"] == [], hooked
        for k, v in model.state_dict().items():
            assert torch.equal(v.to_local(), shards[k]), k
        for state, moment in zip(optimizer.optimizer.state.values(), moments, strict=True):
            assert torch.equal(state["exp_avg"].to_local(), moment)
        accelerator.save_model(model, os.path.join(folder, f"export_{strategy.name}"))
        if rank == 0:
            merged = load_file(merge_sharded_checkpoint(target, os.path.join(folder, f"merged_{strategy.name}")))
            exported = load_file(os.path.join(folder, f"export_{strategy.name}", "model.safetensors"))
            assert merged.keys() == full.keys() == exported.keys()
            for k in full:
                assert torch.equal(merged[k], full[k]) and torch.equal(exported[k], full[k]), k
        accelerator.wait_for_everyone()
    assert OwnCheckpointStrategy.calls == ["save", "load"]
    print(f"rank {rank}: sharded checkpoints OK", flush=True)


if __name__ == "__main__":
    mode, folder = sys.argv[1:3]
    {"full": full, "resume": resume}[mode](folder)
    dist.destroy_process_group()
