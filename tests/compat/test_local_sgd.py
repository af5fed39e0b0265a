"""accel.local_sgd.LocalSGD on 2 real processes (gloo), and its one-process and misuse behaviour."""

from __future__ import annotations

import pytest
import torch

LOCAL_SGD_CHECKS = [
    "start_equal", "different_between_averaging_steps", "equal_after_averaging_steps", "averaging_is_the_mean",
    "different_before_exit", "equal_after_exit", "num_steps", "disabled_keeps_ddp_sync",
]  # fmt: skip


@pytest.mark.parametrize("name", LOCAL_SGD_CHECKS)
def test_parameters_average_every_local_sgd_steps_on_two_processes(two_process_run, name) -> None:
    """scripts/api_checks.py's LocalSGD section (its docstring says what each check means)."""
    two_process_run.run.assert_passed(name)


def test_one_process_counts_steps_and_changes_nothing() -> None:
    from accel import Accelerator
    from accel.local_sgd import LocalSGD

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
        assert local_sgd.enabled is False
        for _ in range(5):
            local_sgd.step()
    assert local_sgd.num_steps == 5
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(ValueError, match="local_sgd_steps must be a positive integer"):
        LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=0)
