"""Guards against silent misuse: the non-finite step guard, prepare() twice, pad_across_processes on a missing dim.

The 2-process behaviour (a NaN/inf loss on one rank skips the step on both) runs under torchrun in
tests/multiprocess/nonfinite_checks.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from checkrun import checks_in

from accel_core import Accelerator, GradientAccumulationPlugin

SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "nonfinite_checks.py"


class ListTracker:
    """A custom tracker object (what ``log_with`` accepts besides names) that keeps what it was given."""

    name = "list"
    requires_logging_directory = False

    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, Any], int | None]] = []

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.logged.append((dict(values), step))

    def finish(self) -> None:
        pass


def _setup(accelerator: Accelerator) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return accelerator.prepare(model, optimizer, scheduler)


def test_skip_nonfinite_skips_the_step_counts_it_and_logs_it():
    tracker = ListTracker()
    accelerator = Accelerator(cpu=True, skip_nonfinite=True, log_with=tracker)
    accelerator.init_trackers("guard")
    model, optimizer, scheduler = _setup(accelerator)
    for step in range(4):
        loss = model(torch.ones(2, 3)).sum() * (float("nan") if step == 2 else 1.0)
        accelerator.backward(loss)
        before = [p.detach().clone() for p in model.parameters()]
        lr_before = scheduler.get_last_lr()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
        assert optimizer.step_was_skipped == (step == 2) == accelerator.optimizer_step_was_skipped
        assert changed == (step != 2), f"step {step}"
        assert (scheduler.get_last_lr() == lr_before) == (step == 2)
        accelerator.log({"loss": 1.0}, step=step)
    assert accelerator.nonfinite_skips == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # Reported once, on the first log after the skip.
    reported = [
        (step, values["train/nonfinite_skips"]) for values, step in tracker.logged if "train/nonfinite_skips" in values
    ]
    assert reported == [(2, 1)]


def test_skip_nonfinite_checks_gradients_and_every_accumulated_loss(monkeypatch):
    monkeypatch.setenv("ACCEL_SKIP_NONFINITE", "1")  # the environment switch
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    model, optimizer, _ = _setup(accelerator)
    # A NaN loss on the first micro-step of two: the whole accumulated step is skipped.
    for micro, factor in enumerate((float("nan"), 1.0)):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(2, 3)).sum() * factor)
            optimizer.step()
            optimizer.zero_grad()
        assert optimizer.step_was_skipped == (micro == 1)
    assert accelerator.nonfinite_skips == 1
    # A finite loss with an inf gradient (set by hand): skipped too.
    for _ in range(2):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(2, 3)).sum())
            if accelerator.sync_gradients:
                next(model.parameters()).grad[0, 0] = float("inf")
            optimizer.step()
            optimizer.zero_grad()
    assert optimizer.step_was_skipped and accelerator.nonfinite_skips == 2
    # A clean step after the skips steps again.
    for _ in range(2):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(2, 3)).sum())
            optimizer.step()
            optimizer.zero_grad()
    assert not optimizer.step_was_skipped and accelerator.nonfinite_skips == 2


def test_skip_nonfinite_is_off_by_default():
    accelerator = Accelerator(cpu=True)
    model, optimizer, _ = _setup(accelerator)
    accelerator.backward(model(torch.ones(2, 3)).sum() * float("nan"))
    optimizer.step()
    assert not optimizer.step_was_skipped and accelerator.nonfinite_skips == 0
    assert not torch.isfinite(next(model.parameters())).all()


def test_prepare_twice_returns_the_prepared_objects_registered_once():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    prepared = accelerator.prepare(model, optimizer, scheduler, loader)
    assert accelerator.prepare(model, optimizer, scheduler) == prepared[:3]  # the originals again
    assert accelerator.prepare(*prepared) == prepared  # the prepared objects again
    assert accelerator.prepare_model(model) is prepared[0]
    assert accelerator.prepare_optimizer(optimizer) is prepared[1]
    assert accelerator.prepare_scheduler(scheduler) is prepared[2]
    assert accelerator.prepare_data_loader(prepared[3]) is prepared[3]
    # One new object among prepared ones: only it is prepared.
    other = torch.nn.Linear(2, 2)
    again, new = accelerator.prepare(prepared[0], other)
    assert again is prepared[0] and new is not prepared[0]
    counts = [len(x) for x in (accelerator._models, accelerator._optimizers, accelerator._schedulers)]
    assert counts == [2, 1, 1] and len(accelerator._dataloaders) == 1


def test_prepare_twice_then_save_and_load_state(tmp_path):
    """The issue's case: preparing twice used to make load_state fail with 'holds 2 models but 1 were prepared'."""
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    prepared = accelerator.prepare(model)
    accelerator.prepare(model)
    accelerator.save_state(str(tmp_path / "ckpt"))
    fresh = Accelerator(cpu=True)
    fresh.prepare(torch.nn.Linear(3, 1))
    fresh.load_state(str(tmp_path / "ckpt"))
    assert torch.equal(fresh._models[0].weight, prepared.weight)


def test_pad_across_processes_on_a_missing_dimension_raises():
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"dim=5.*2 dimension\(s\).*between -2 and 1"):
        accelerator.pad_across_processes(torch.ones(2, 3), dim=5)
    with pytest.raises(ValueError, match=r"dim=-3"):
        accelerator.pad_across_processes(torch.ones(2, 3), dim=-3)
    assert accelerator.pad_across_processes(torch.ones(2, 3), dim=-1).shape == (2, 3)  # negative dims still work
    # In a structure, tensors without the dimension are left alone while another has it.
    mixed = accelerator.pad_across_processes({"a": torch.ones(2, 3), "b": torch.ones(2)}, dim=1)
    assert mixed["a"].shape == (2, 3) and mixed["b"].shape == (2,)


@pytest.fixture(scope="module")
def nonfinite_run(torchrun_checks):
    return torchrun_checks(SCRIPT)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_nonfinite_checks_on_two_processes(nonfinite_run, name):
    nonfinite_run.assert_passed(name)


def test_an_optimizer_over_another_models_parameters_is_refused_at_prepare():
    accelerator = Accelerator(cpu=True)
    model, other = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=r"The optimizer SGD holds none of the parameters of the model\(s\) prepared"):
        accelerator.prepare(model, torch.optim.SGD(other.parameters(), lr=0.1))
    # An extra optimizer over parameters outside the model (a learnable temperature) beside the model's own is fine.
    temperature = torch.nn.Parameter(torch.ones(()))
    extra = torch.nn.Linear(4, 2)
    accelerator.prepare(extra, torch.optim.SGD(extra.parameters(), lr=0.1), torch.optim.SGD([temperature], lr=0.1))
    # Its own model's optimizer, in the same call or a later one, is prepared as before.
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    later = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    assert later.optimizer.param_groups[0]["params"][0] is next(model.parameters())


def test_backward_of_a_number_names_the_tensor_to_pass():
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    loss = model(torch.ones(2, 4)).sum()
    with pytest.raises(TypeError, match=r"needs the loss tensor the model's output produced, got float 1\.0: pass"):
        accelerator.backward(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got float .*before \.item\(\) or float\(\)"):
        accelerator.backward(loss.item())  # type: ignore[arg-type]
    accelerator.backward(loss)
    assert model.weight.grad is not None


def test_deepspeed_required_refuses_only_once_an_accelerator_without_deepspeed_exists():
    """``accelerate.utils.deepspeed_required``: a plain PartialState does not count as an Accelerator (asked through
    ``AcceleratorState.has_accelerator_settings``, not the shared dict); an Accelerator without DeepSpeed does."""
    from accel_core.compat.requirements import deepspeed_required
    from accel_core.state import AcceleratorState, PartialState

    @deepspeed_required
    def engine_only() -> str:
        return "ran"

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        assert engine_only() == "ran"  # no state at all
        PartialState(cpu=True)
        assert not AcceleratorState.has_accelerator_settings() and PartialState.is_initialized()
        assert engine_only() == "ran"
        Accelerator(cpu=True)
        assert AcceleratorState.has_accelerator_settings()
        with pytest.raises(ValueError, match="engine_only needs DeepSpeed"):
            engine_only()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
