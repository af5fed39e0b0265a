"""The Accelerator on one process: clear errors, accumulation, precision, scheduler stepping."""

from __future__ import annotations

import re

import pytest
import torch

import accel_core
from accel_core import (
    Accelerator,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradientState,
    MissingPackageError,
)

VERSION = re.escape(accel_core.__version__)  # the hints pin accel's own release


def small_setup(accelerator, lr=0.1):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return accelerator.prepare(model, optimizer, scheduler)


def test_unknown_mixed_precision():
    with pytest.raises(ValueError, match="Unknown mixed_precision mode: 'fp12'"):
        Accelerator(mixed_precision="fp12")


def test_device_placement_of_wrong_length():
    accelerator = Accelerator()
    with pytest.raises(ValueError, match="should be a list with 2 elements"):
        accelerator.prepare(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), device_placement=[True])


def test_preparing_an_unsupported_object():
    with pytest.raises(TypeError, match="Cannot prepare an object of type dict"):
        Accelerator().prepare({"not": "preparable"})


def test_missing_backend_package_names_the_extra(monkeypatch):
    monkeypatch.setenv("ACCEL_STRATEGY", "xla")  # a backend whose package is not installed here
    with pytest.raises(ImportError, match=rf'pip install "accel\[xla\]=={VERSION}"'):
        Accelerator()
    monkeypatch.delenv("ACCEL_STRATEGY")
    # accel-fp8 is installed in the workspace: hide the precision entry points as if it were not.
    from accel_core import discovery

    real_group = discovery._group
    discovery.clear_cache()
    monkeypatch.setattr(discovery, "_group", lambda group: {} if group == "accel.precisions" else real_group(group))
    try:
        with pytest.raises(MissingPackageError, match=r"accel\[fp8\]"):
            Accelerator(mixed_precision="fp8")
    finally:
        discovery.load.cache_clear()  # nothing found was cached; _group itself comes back with monkeypatch


def test_gradient_accumulation_steps_together_with_plugin():
    with pytest.raises(ValueError, match="only pass one of"):
        Accelerator(gradient_accumulation_steps=4, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))


def test_duplicate_and_foreign_kwargs_handlers():
    with pytest.raises(ValueError, match="only pass one `DistributedDataParallelKwargs`"):
        Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()])
    with pytest.raises(TypeError, match="KwargsHandler"):
        Accelerator(kwargs_handlers=[{"find_unused_parameters": True}])


def test_accumulation_steps_optimizer_and_scheduler_once_per_real_step():
    accelerator = Accelerator(gradient_accumulation_steps=3)
    model, optimizer, scheduler = small_setup(accelerator)
    weights = []
    for _ in range(6):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(2, 3)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        weights.append(model.weight.detach().clone())
    # weights change only on micro-steps 3 and 6; the scheduler stepped twice
    changed = [not torch.equal(weights[i], weights[i - 1]) for i in range(1, 6)]
    assert changed == [False, True, False, False, True]
    assert scheduler.scheduler.last_epoch == 2
    assert scheduler.get_last_lr() == pytest.approx([0.1 / 3])


def test_accumulated_gradient_equals_full_batch_gradient():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model, _optimizer, _ = small_setup(accelerator)
    x = torch.randn(8, 3)
    for half in (x[:4], x[4:]):
        with accelerator.accumulate(model):
            accelerator.backward(model(half).pow(2).mean())
    expected_model = torch.nn.Linear(3, 1)
    expected_model.load_state_dict(accelerator.unwrap_model(model).state_dict())
    expected_model(x).pow(2).mean().backward()
    assert torch.allclose(model.weight.grad, expected_model.weight.grad, atol=1e-6)


class _LastBatchSignal:
    """A stand-in for a prepared dataloader's end-of-data report (the protocol accel-data implements)."""

    end_of_dataloader = True
    remainder = -1


def test_end_of_data_forces_a_sync():
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, _optimizer, _ = small_setup(accelerator)
    state = GradientState()
    signal = _LastBatchSignal()
    state.register_dataloader(signal)
    try:
        with accelerator.accumulate(model):
            assert accelerator.sync_gradients, "the last batch of the data must sync whatever the step count"
    finally:
        state.unregister_dataloader(signal)
    with accelerator.accumulate(model):
        assert not accelerator.sync_gradients


def test_fp16_overflow_skips_the_step_and_the_scheduler():
    accelerator = Accelerator(mixed_precision="fp16")
    model, optimizer, scheduler = small_setup(accelerator)
    before = model.weight.detach().clone()
    accelerator.backward(model(torch.ones(1, 3)).sum() * float("inf"))
    optimizer.step()
    scheduler.step()
    assert accelerator.optimizer_step_was_skipped
    assert torch.equal(model.weight.detach(), before)
    assert scheduler.scheduler.last_epoch == 0
    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(1, 3)).sum())
    norm = accelerator.clip_grad_norm_(model.parameters(), 0.5)
    assert norm == pytest.approx(2.0, rel=1e-2)  # unscaled gradient [1,1,1] and bias 1: norm 2
    optimizer.step()
    scheduler.step()
    assert not accelerator.optimizer_step_was_skipped and scheduler.scheduler.last_epoch == 1


def test_bf16_forward_and_unwrap_without_fp32_wrapper():
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    assert model(torch.randn(2, 4)).dtype == torch.float32
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain(torch.randn(2, 4)).dtype == torch.bfloat16  # wrapper gone: raw autocast output


def test_state_dict_save_and_register_for_checkpointing(tmp_path):
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 2).half())
    assert all(v.dtype == torch.float32 for v in accelerator.get_state_dict(model).values())
    accelerator.save({"w": torch.ones(1)}, tmp_path / "obj.pt")
    assert torch.load(tmp_path / "obj.pt", weights_only=True)["w"].item() == 1.0
    with pytest.raises(ValueError, match="state_dict"):
        accelerator.register_for_checkpointing(object())


def test_unknown_tracker_is_a_clear_error():
    with pytest.raises(ImportError, match="Tracker 'nonexistent' is not available"):
        Accelerator(log_with="nonexistent")


def test_state_answers_backend_plugin_lookups_of_the_reference_api():
    accelerator = Accelerator()
    assert accelerator.state.fsdp_plugin is None and accelerator.state.deepspeed_plugin is None
    with pytest.raises(AttributeError):
        accelerator.state.no_such_thing
