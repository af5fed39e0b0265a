"""save_state / load_state through the real Accelerator on one process."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from accel_checkpoint import wait_for_checkpoint
from accel_checkpoint.content_hash import hash_file
from accel_checkpoint.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    UnsafeCheckpointError,
)
from accel_core import Accelerator, AcceleratorState
from accel_core.configuration import ProjectConfiguration


class Counter:
    """A registered custom object."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def make(accelerator, seed=0, n_models=1):
    torch.manual_seed(seed)
    objects = []
    for _ in range(n_models):
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        objects += [model, optimizer]
    objects.append(torch.optim.lr_scheduler.StepLR(objects[1], step_size=2, gamma=0.5))
    return accelerator.prepare(*objects)


def train(accelerator, model, optimizer, scheduler, steps):
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 4)  # torch RNG: replayed only if it was restored
        loss = model(x).pow(2).mean()  # dropout: torch RNG again
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_round_trip_resumes_exactly_with_scaler_custom_objects_and_step(tmp_path):
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    model, optimizer, scheduler = make(accelerator)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    train(accelerator, model, optimizer, scheduler, 3)
    counter.count, accelerator.step = 5, 7
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    assert sorted(os.listdir(folder)) == sorted(
        [
            "COMPLETE",
            "accel_checkpoint.json",
            "custom_checkpoint_0.pt",
            "model.safetensors",
            "optimizer.bin",
            "random_states_0.pt",
            "scaler.pt",
            "scheduler.bin",
        ]
    )
    expected_losses = train(accelerator, model, optimizer, scheduler, 3)
    expected = weights(model)
    scale = accelerator.scaler.get_scale()
    counter.count, accelerator.step = 0, 0

    accelerator.load_state(folder)
    assert counter.count == 5 and accelerator.step == 7
    assert train(accelerator, model, optimizer, scheduler, 3) == expected_losses  # data + dropout replayed
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())
    assert accelerator.scaler.get_scale() == scale
    assert scheduler.scheduler.last_epoch == 6


def test_hooks_see_the_folder_being_built_and_may_take_over_models(tmp_path):
    accelerator = Accelerator(cpu=True)
    make(accelerator)
    seen = {}

    def save_hook(models, weights_list, output_dir):
        seen["save"] = (len(models), len(weights_list), output_dir)
        with open(os.path.join(output_dir, "extra.json"), "w") as handle:
            json.dump({"hidden": 16}, handle)
        weights_list.pop()  # the hook saves this model itself (here: not at all)

    def load_hook(models, input_dir):
        seen["load"] = input_dir
        models.pop()

    accelerator.register_save_state_pre_hook(save_hook)
    handle = accelerator.register_load_state_pre_hook(load_hook)
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    assert seen["save"][:2] == (1, 1) and ".partial-" in seen["save"][2]
    assert os.path.exists(os.path.join(folder, "extra.json")) and not os.path.exists(
        os.path.join(folder, "model.safetensors")
    )
    accelerator.load_state(folder)
    assert seen["load"] == folder
    handle.remove()
    with pytest.raises(CheckpointMismatchError, match="holds 0 models but 1 were prepared"):
        accelerator.load_state(folder)


def test_automatic_naming_total_limit_and_resume_numbering(tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=3)
    accelerator = Accelerator(cpu=True, project_config=config)
    model, optimizer, scheduler = make(accelerator)
    base = tmp_path / "checkpoints"
    for i in range(7):
        train(accelerator, model, optimizer, scheduler, 1)
        assert accelerator.save_state().endswith(f"checkpoint_{i}")
        assert len([n for n in os.listdir(base) if n.startswith("checkpoint_")]) == min(i + 1, 3)
    assert sorted(os.listdir(base)) == ["checkpoint_4", "checkpoint_5", "checkpoint_6"]
    expected = weights(model)

    # An interrupted save: a numbered folder without its marker, and a hidden partial folder.
    shutil.copytree(base / "checkpoint_6", base / "checkpoint_9")
    os.remove(base / "checkpoint_9" / "COMPLETE")
    os.makedirs(base / ".checkpoint_10.partial-deadbeef")

    fresh = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=3),
    )
    model2, _optimizer2, _scheduler2 = make(fresh, seed=1)
    fresh.load_state()  # the newest complete one: checkpoint_6, not the unfinished checkpoint_9
    assert all(torch.equal(v, expected[k]) for k, v in model2.state_dict().items())
    assert fresh.project_configuration.iteration == 7
    with pytest.raises(IncompleteCheckpointError, match="no COMPLETE marker"):
        fresh.load_state(str(base / "checkpoint_9"))
    assert fresh.save_state().endswith("checkpoint_7")
    assert not (base / ".checkpoint_10.partial-deadbeef").exists()  # leftovers are cleaned
    assert sorted(os.listdir(base)) == ["checkpoint_5", "checkpoint_6", "checkpoint_7", "checkpoint_9"]
    with pytest.raises(ValueError, match="already exists"):
        fresh.project_configuration.iteration = 7
        fresh.save_state()


def test_clear_errors(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, _optimizer, _scheduler = make(accelerator)
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        accelerator.load_state(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="needs input_dir"):
        accelerator.load_state()
    with pytest.raises(ValueError, match="needs an output_dir"):
        accelerator.save_state()
    folder = accelerator.save_state(str(tmp_path / "one"))

    two = Accelerator(cpu=True)
    make(two, n_models=2)
    with pytest.raises(CheckpointMismatchError, match="holds 1 models but 2 were prepared"):
        two.load_state(folder)
    three = Accelerator(cpu=True)
    three.prepare(torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2)))
    with pytest.raises(CheckpointMismatchError, match="holds 1 optimizers but 0 were prepared"):
        three.load_state(folder)

    path = os.path.join(folder, "optimizer.bin")
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 100)
    before = weights(model)
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.bin has \d+ bytes but \d+ were written"):
        accelerator.load_state(folder)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing was half-loaded


def test_malicious_custom_state_is_refused_through_load_state(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCEL_ALLOW_UNSAFE_PICKLE", raising=False)
    accelerator = Accelerator(cpu=True)
    make(accelerator)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    victim = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(victim), "w"))

    path = os.path.join(folder, "custom_checkpoint_0.pt")
    torch.save({"count": Payload()}, path)
    # An attacker can edit the metadata too: keep the recorded size and hash consistent.
    meta_path = os.path.join(folder, "accel_checkpoint.json")
    with open(meta_path) as handle:
        meta = json.load(handle)
    meta["files"]["custom_checkpoint_0.pt"] = os.path.getsize(path)
    meta["hashes"]["custom_checkpoint_0.pt"] = hash_file(path)
    with open(meta_path, "w") as handle:
        json.dump(meta, handle)
    with pytest.raises(UnsafeCheckpointError, match=r"custom_checkpoint_0\.pt.*io\.open.*allow_unsafe_pickle=True"):
        accelerator.load_state(folder)
    assert not victim.exists()


def test_explicit_folder_is_replaced_whole(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = make(accelerator)
    target = str(tmp_path / "ckpt")
    accelerator.save_state(target)
    with open(os.path.join(target, "stale.txt"), "w") as handle:
        handle.write("from the first save")
    train(accelerator, model, optimizer, scheduler, 1)
    accelerator.save_state(target)
    assert not os.path.exists(os.path.join(target, "stale.txt"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_async_save_snapshots_at_call_time_and_completes_on_wait(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = make(accelerator)
    train(accelerator, model, optimizer, scheduler, 2)
    snapshot = weights(model)
    folder = accelerator.save_state(str(tmp_path / "a"), async_save=True)
    train(accelerator, model, optimizer, scheduler, 2)  # training goes on while it is written
    assert accelerator.wait_for_checkpoint() == folder
    assert os.path.exists(os.path.join(folder, "COMPLETE"))
    assert accelerator.wait_for_checkpoint() is None  # nothing pending any more
    fresh = Accelerator(cpu=True)
    model2, _, _ = make(fresh, seed=3)
    fresh.load_state(folder)
    assert all(torch.equal(v, snapshot[k]) for k, v in model2.state_dict().items())
    # A second async save reuses the CPU buffers and a load waits for the pending write first.
    folder_b = accelerator.save_state(str(tmp_path / "b"), async_save=True)
    assert accelerator.load_state(folder_b) == folder_b
    accelerator.save_state(str(tmp_path / "c"), async_save=True)
    accelerator.end_training()  # waits for the pending write
    assert os.path.exists(tmp_path / "c" / "COMPLETE")


def test_async_failure_is_raised_on_wait_and_leaves_nothing(tmp_path):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model.register_buffer("phase", torch.zeros(2, dtype=torch.complex64))  # safetensors cannot store it
    accelerator.prepare(model)
    accelerator.save_state(str(tmp_path / "c"), async_save=True)
    with pytest.raises(CheckpointError, match="complex64"):
        wait_for_checkpoint(accelerator)
    assert os.listdir(tmp_path) == []
    accelerator.save_state(str(tmp_path / "c"), safe_serialization=False)  # the fix the message gives
    accelerator.load_state(str(tmp_path / "c"))


def test_reference_layout_checkpoint_loads_its_numpy_rng_pickles_as_data(tmp_path):
    """Accelerate's layout keeps numpy's RNG state as an array in random_states_0.pkl: data, loaded as such
    (as Accelerate does), whatever else the process imported; a class in the same file is still refused."""
    import random

    import numpy as np

    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = make(accelerator)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(legacy / "model.safetensors"))
    torch.save(optimizer.state_dict(), legacy / "optimizer.bin")
    torch.save(scheduler.state_dict(), legacy / "scheduler.bin")
    np.random.seed(5)
    expected = np.random.rand(3)
    np.random.seed(5)
    torch.save(
        {
            "random_state": random.getstate(),
            "numpy_random_seed": np.random.get_state(),
            "torch_manual_seed": torch.get_rng_state(),
        },
        legacy / "random_states_0.pkl",
    )
    np.random.seed(99)
    before = set(map(id, torch.serialization.get_safe_globals()))
    with pytest.warns(UserWarning, match="legacy"):
        accelerator.load_state(str(legacy))
    assert np.array_equal(np.random.rand(3), expected)
    assert set(map(id, torch.serialization.get_safe_globals())) == before  # nothing left allow-listed, nothing taken
    with open(legacy / "random_states_0.pkl", "wb") as handle:  # the same state with a class in it
        torch.save(
            {
                "random_state": random.getstate(),
                "numpy_random_seed": np.random.get_state(),
                "torch_manual_seed": torch.get_rng_state(),
                "extra": TrustedLegacyThing(),
            },
            handle,
        )
    refused = pytest.raises(UnsafeCheckpointError, match=r"random_states_0\.pkl")
    with pytest.warns(UserWarning, match="legacy"), refused as info:
        accelerator.load_state(str(legacy))
    assert "TrustedLegacyThing" in str(info.value) and "numpy" not in str(info.value)
    with pytest.warns(UserWarning):
        accelerator.load_state(str(legacy), allow_unsafe_pickle=True)


class TrustedLegacyThing:
    pass


def _write_reference_checkpoint(folder, model, optimizer, scheduler, finished: bool = True) -> None:
    """A checkpoint as Accelerate's save_state writes it: no accel metadata, no COMPLETE marker, the RNG states last."""
    import random

    import numpy as np
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    torch.save(scheduler.state_dict(), folder / "scheduler.bin")
    if finished:
        rng = {"random_state": random.getstate(), "numpy_random_seed": np.random.get_state()}
        torch.save({**rng, "torch_manual_seed": torch.get_rng_state()}, folder / "random_states_0.pkl")


def test_an_accelerate_runs_automatic_checkpoints_are_resumed_and_pruned(tmp_path):
    # A run moved from Accelerate keeps its project folder: load_state() finds Accelerate's newest finished
    # checkpoint_<n> (which has no COMPLETE marker), and total_limit counts those folders as Accelerate did.
    project = ProjectConfiguration(str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=project)
    model, optimizer, scheduler = make(accelerator)
    checkpoints = tmp_path / "checkpoints"
    weights = {}
    for number in (0, 1, 2):
        with torch.no_grad():
            model[0].weight.fill_(float(number))
        weights[number] = model[0].weight.clone()
        _write_reference_checkpoint(checkpoints / f"checkpoint_{number}", model, optimizer, scheduler, number < 2)
    shutil.rmtree(checkpoints / "checkpoint_2")  # an Accelerate save cut short (no RNG states) is not taken
    _write_reference_checkpoint(checkpoints / "checkpoint_2", model, optimizer, scheduler, finished=False)
    with pytest.warns(UserWarning, match="legacy"):
        accelerator.load_state()
    assert torch.equal(model[0].weight, weights[1])
    assert accelerator.project_configuration.iteration == 2
    shutil.rmtree(checkpoints / "checkpoint_2")
    saved = accelerator.save_state()
    assert os.path.basename(saved) == "checkpoint_2"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_1", "checkpoint_2"]  # checkpoint_0 pruned


def test_save_model_through_the_accelerator(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, _, _ = make(accelerator)
    accelerator.save_model(model, str(tmp_path / "export"), max_shard_size="200B")
    index = json.loads((tmp_path / "export" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    with pytest.raises(ValueError, match="is a file"):
        accelerator.save_model(model, str(tmp_path / "export" / sorted(set(index["weight_map"].values()))[0]))


def test_a_compiled_models_checkpoint_holds_its_own_keys_and_loads_either_way(tmp_path):
    # As Accelerate's save_state: `weight`, not torch.compile's `_orig_mod.weight`, so the weights load into the
    # model compiled or not (inference without compile, Accelerate itself). accel 0.1.0 wrote the prefixed keys:
    # those checkpoints still load.
    from safetensors.torch import load_file, save_file

    def prepared(dynamo_backend):
        AcceleratorState._reset_state(reset_partial_state=True)
        accelerator = Accelerator(cpu=True, dynamo_backend=dynamo_backend)
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        return accelerator, *accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    accelerator, model, _ = prepared("eager")
    assert "_orig_mod" in dict(model.named_modules())  # compiled
    folder = accelerator.save_state(str(tmp_path / "compiled"))
    assert sorted(load_file(os.path.join(folder, "model.safetensors"))) == ["bias", "weight"]
    for backend in ("no", "eager"):
        accelerator, model, _ = prepared(backend)
        with torch.no_grad():
            model.weight.zero_()
        accelerator.load_state(folder)
        assert model.weight.abs().sum() > 0, backend
    weights = os.path.join(folder, "model.safetensors")
    old = load_file(weights)
    save_file({f"_orig_mod.{key}": value for key, value in old.items()}, weights)
    meta_path = os.path.join(folder, "accel_checkpoint.json")
    with open(meta_path) as handle:
        meta = json.load(handle)
    meta["files"]["model.safetensors"], meta["hashes"]["model.safetensors"] = (
        os.path.getsize(weights),
        hash_file(weights),
    )
    with open(meta_path, "w") as handle:
        json.dump(meta, handle)
    accelerator, model, _ = prepared("no")
    accelerator.load_state(folder)
    assert torch.equal(model.weight, old["weight"])


class _ShuffledStream(torch.utils.data.IterableDataset):
    """An iterable dataset shuffling with its own generator (saved with the loader's state)."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(3)

    def __len__(self) -> int:
        return 16

    def __iter__(self):
        yield from torch.randperm(16, generator=self.generator).tolist()


def _epoch_end_run(project, kind, *, idiom=None, stop_at=None, epochs=4):
    """Trains ``epochs`` epochs of 4 steps, returns each epoch's batches; ``stop_at`` saves after that step and stops;
    ``idiom`` resumes from the saved state as diffusers' or transformers' no_trainer scripts do."""
    from accel_core.configuration import DataLoaderConfiguration

    torch.manual_seed(0)
    config = DataLoaderConfiguration(use_seedable_sampler=kind == "seedable")
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    if kind == "iterable":
        loader = torch.utils.data.DataLoader(_ShuffledStream(), batch_size=4)
    else:
        generator = torch.Generator().manual_seed(5) if kind == "generator" else None
        workers = 2 if kind == "workers" else 0
        loader = torch.utils.data.DataLoader(
            range(16), batch_size=4, shuffle=True, generator=generator, num_workers=workers
        )
    model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step, first_epoch, skip = 0, 0, None
    if idiom is not None:
        accelerator.load_state(str(project / "ckpt"))
        step = stop_at
        first_epoch = step // len(loader)  # both idioms: a checkpoint of step 4 resumes at epoch 1
        if idiom == "no_trainer":
            skip = step - first_epoch * len(loader)  # 0: skip_first_batches(loader, 0) for the resumed epoch
    epochs_seen = {}
    for epoch in range(first_epoch, epochs):
        active = accelerator.skip_first_batches(loader, skip) if skip is not None and epoch == first_epoch else loader
        seen = epochs_seen[epoch] = []
        for batch in active:
            seen.append(batch.tolist())
            loss = model(batch.float().unsqueeze(1)).pow(2).mean()  # dropout: the global RNG moves each step
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == stop_at and idiom is None:
                accelerator.save_state(str(project / "ckpt"))
                return epochs_seen
    return epochs_seen


@pytest.mark.parametrize("kind", ["global_rng", "generator", "seedable", "workers", "iterable"])
@pytest.mark.parametrize("idiom", ["diffusers", "no_trainer"])
def test_a_checkpoint_after_an_epochs_last_step_resumes_with_the_next_epoch(tmp_path, kind, idiom):
    """Step-based checkpointing whose interval divides the epoch saves right after an epoch's last batch. The
    resumed loops (diffusers: ``first_epoch = global_step // steps_per_epoch``, then plain epochs; no_trainer:
    ``skip_first_batches(loader, 0)`` for the resumed epoch) must get the uninterrupted run's epochs 1 to 3, orders
    included. They got an empty epoch 1 (and each later epoch the previous one's order), or epoch 0's order again."""
    full = _epoch_end_run(tmp_path, kind)
    assert len(full) == 4 and all(len(batches) == 4 for batches in full.values())
    assert len({str(batches) for batches in full.values()}) == 4, "each epoch has its own order"
    _epoch_end_run(tmp_path, kind, stop_at=4)
    resumed = _epoch_end_run(tmp_path, kind, idiom=idiom, stop_at=4)
    assert resumed == {epoch: full[epoch] for epoch in (1, 2, 3)}


def test_a_checkpoint_saved_at_an_epochs_last_step_or_after_it_is_the_same(tmp_path):
    """Saved inside the loop after the last batch or after the loop ended, the loader's position is the same."""
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(
        torch.utils.data.DataLoader(range(8), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1))
    )
    states = []
    for batch_index, _ in enumerate(loader):
        if batch_index == len(loader) - 1:
            states.append(loader.state_dict())
    states.append(loader.state_dict())
    assert states[0]["epoch"] == states[1]["epoch"] == 1
    assert states[0]["batches_yielded"] == states[1]["batches_yielded"] == 0
    assert torch.equal(states[0]["generator_state"], states[1]["generator_state"])
    assert states[0]["sampler_draw"] is None and states[0]["base_seed_state"] is None
