"""Checkpoints of a compiled model on XLA's CPU device: ``save_state`` writes the user's module as the model's record
holds it (outside ``torch.compile``'s wrapper), so the file has the model's own keys, loads into a compiled or a plain
model, and resuming from it continues exactly as the run that saved it.

Needs torch-xla (tests/xla/setup.sh builds its environment); skipped without it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

torch_xla = pytest.importorskip("torch_xla", reason="needs torch-xla: run tests/xla/run.sh")

import torch  # noqa: E402

from accel import Accelerator  # noqa: E402
from accel_core.model_utils import is_compiled_module  # noqa: E402
from accel_core.state import AcceleratorState, GradientState  # noqa: E402

MODEL_KEYS = ["0.weight", "0.bias", "2.weight", "2.bias"]


def reset_state() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def prepared_job(dynamo_backend: str, seed: int) -> tuple[Accelerator, Any, Any]:
    """A fresh Accelerator (a new run) with a model and its optimizer prepared; the model's values from ``seed``."""
    reset_state()
    accelerator = Accelerator(strategy="xla", dynamo_backend=dynamo_backend)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


BATCHES = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(6)]


def train(accelerator: Accelerator, model: Any, optimizer: Any, batches: list[torch.Tensor]) -> list[float]:
    losses = []
    for x in batches:
        x = x.to(accelerator.device)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_compiled_model_is_saved_under_its_own_keys_and_resumes_exactly(tmp_path: Path) -> None:
    accelerator, model, optimizer = prepared_job("eager", seed=0)
    assert is_compiled_module(model)  # what the script runs is torch.compile's wrapper
    assert list(model.state_dict()) == [f"_orig_mod.{key}" for key in MODEL_KEYS]
    train(accelerator, model, optimizer, BATCHES[:3])
    folder = Path(accelerator.save_state(str(tmp_path / "ckpt")))
    on_disk = torch.load(folder / "sharded" / "model_0.bin", weights_only=True)
    assert list(on_disk) == MODEL_KEYS  # the module's own keys, not the wrapper's "_orig_mod." ones
    assert list(accelerator.get_state_dict(model)) == MODEL_KEYS  # the same keys get_state_dict gives
    continued = train(accelerator, model, optimizer, BATCHES[3:])
    final = {key: value.cpu() for key, value in accelerator.get_state_dict(model).items()}

    # A new compiled run from other initial values resumes where the saved one was: the same losses, bit for bit.
    accelerator, model, optimizer = prepared_job("eager", seed=5)
    accelerator.load_state(str(folder))
    assert train(accelerator, model, optimizer, BATCHES[3:]) == continued
    for key, value in accelerator.get_state_dict(model).items():
        assert torch.equal(value.cpu(), final[key]), key

    # The same checkpoint resumes a run that does not compile the model.
    accelerator, model, optimizer = prepared_job("no", seed=5)
    assert not is_compiled_module(model)
    accelerator.load_state(str(folder))
    assert train(accelerator, model, optimizer, BATCHES[3:]) == pytest.approx(continued, rel=1e-5, abs=1e-6)


def test_checkpoint_of_a_compiled_model_with_the_wrappers_keys_still_loads(tmp_path: Path) -> None:
    """Before the strategy read the record, a compiled model's file held torch.compile's keys ("_orig_mod.0.weight");
    such a checkpoint's shards load into the module of the record."""
    accelerator, model, optimizer = prepared_job("eager", seed=0)
    train(accelerator, model, optimizer, BATCHES[:3])
    folder = Path(accelerator.save_state(str(tmp_path / "ckpt"))) / "sharded"
    saved = {key: value.cpu().clone() for key, value in accelerator.get_state_dict(model).items()}
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    torch.save({f"_orig_mod.{key}": value for key, value in saved.items()}, old / "model_0.bin")

    accelerator, model, optimizer = prepared_job("eager", seed=5)
    # The strategy's own loading, past load_state's content hashes (which the rewritten file would fail).
    accelerator.strategy.load_sharded(accelerator.prepared, str(old), io=None)  # xla reads its files with torch.load
    for key, value in accelerator.get_state_dict(model).items():
        assert torch.equal(value.cpu(), saved[key]), key
