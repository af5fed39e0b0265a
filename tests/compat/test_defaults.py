"""Defaults changed to the reference's: Accelerator(gradient_accumulation_steps=1) and an FSDP plugin's
state_dict_type inferred from the configs given (checked in tests/fsdp/test_fsdp_config.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from accel import Accelerator, AcceleratorState, GradientAccumulationPlugin, GradientState


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_gradient_accumulation_steps_defaults_to_one_and_the_environment_may_raise_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Accelerator(cpu=True).gradient_accumulation_steps == 1
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "3")
    assert Accelerator(cpu=True).gradient_accumulation_steps == 3  # as Accelerate reads its variable
    assert Accelerator(cpu=True, gradient_accumulation_steps=1).gradient_accumulation_steps == 3
    assert Accelerator(cpu=True, gradient_accumulation_steps=2).gradient_accumulation_steps == 2


def test_the_default_steps_next_to_a_plugin_is_not_a_conflict() -> None:
    plugin = GradientAccumulationPlugin(num_steps=4)
    assert (
        Accelerator(
            cpu=True, gradient_accumulation_steps=1, gradient_accumulation_plugin=plugin
        ).gradient_accumulation_steps
        == 4
    )
    with pytest.raises(ValueError, match="only pass one of"):
        Accelerator(cpu=True, gradient_accumulation_steps=2, gradient_accumulation_plugin=plugin)
