"""The state classes' reference members on one process: what scripts and test suites written for Accelerate
read and assign on ``PartialState`` / ``AcceleratorState`` / ``GradientState``, and the reset error."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from accel import (
    Accelerator,
    AcceleratorState,
    DistributedType,
    GradientAccumulationPlugin,
    GradientState,
    PartialState,
)
from accel.utils import TorchDynamoPlugin, get_model_tp_size


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_distributed_type_is_assignable_as_in_the_reference() -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.state.distributed_type == DistributedType.NO
    accelerator.state.distributed_type = DistributedType.MULTI_CPU
    assert AcceleratorState().distributed_type == DistributedType.MULTI_CPU
    assert PartialState().distributed_type == DistributedType.MULTI_CPU  # one shared state, as the reference's
    AcceleratorState().distributed_type = "NO"
    assert accelerator.distributed_type == DistributedType.NO


def test_what_the_accelerator_set_up_is_read_from_the_state() -> None:
    dynamo = TorchDynamoPlugin(backend="no")
    accelerator = Accelerator(cpu=True, dynamo_plugin=dynamo)
    state = AcceleratorState()
    assert state.dynamo_plugin is dynamo is accelerator.dynamo_plugin
    assert state.parallelism_config is accelerator.parallelism_config
    assert state.device_mesh is accelerator.device_mesh
    assert state.fsdp_plugin is None and state.deepspeed_plugin is None and state.megatron_lm_plugin is None
    assert state.deepspeed_plugins is None and not state.is_fsdp2
    with pytest.raises(ValueError, match="needs DeepSpeed"):
        state.get_deepspeed_plugin("default")
    with pytest.raises(ValueError, match="needs DeepSpeed"):
        state.select_deepspeed_plugin("default")


def test_the_states_print_as_the_references() -> None:
    # Scripts print the state to their logs (`logger.info(accelerator.state)`), as run_glue_no_trainer does.
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2)
    assert str(accelerator.state) == (
        f"Distributed environment: {accelerator.distributed_type}\nNum processes: 1\nProcess index: 0\n"
        "Local process index: 0\nDevice: cpu\n\nMixed precision type: bf16\n"
    )
    assert str(accelerator.gradient_state) == (
        "Sync Gradients: True\nAt end of current dataloader: False\nExtra samples added: -1\n"
        "Gradient accumulation plugin: {'num_steps': 2}\n"
    )


def test_process_members() -> None:
    state = PartialState(cpu=True)
    assert state.default_device.index is None
    assert state.default_device.type == ("cuda" if torch.cuda.is_available() else state.default_device.type)
    state.set_device()  # the CPU: nothing to select
    assert state.device == torch.device("cpu")


def test_gradient_state_plugin_kwargs_and_adjust_scheduler() -> None:
    assert not GradientState().initialized or GradientState().plugin_kwargs == {}
    Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4, sync_each_batch=True))
    state = GradientState()
    assert state.initialized
    assert state.plugin_kwargs == {"num_steps": 4, "sync_each_batch": True}
    assert state.adjust_scheduler is False  # the reference reads the default True as left out
    Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(adjust_scheduler=False))
    assert GradientState().plugin_kwargs == {"adjust_scheduler": False}
    GradientState._reset_state()
    assert not GradientState._shared_state


def test_gradient_state_keeps_the_reference_loader_registration_names() -> None:
    """Loaders written for Accelerate register with ``_add_dataloader`` / ``_remove_dataloader``; accel's own
    loaders use the public ``register_dataloader`` / ``unregister_dataloader``: both reach the same stack."""

    class Outer:
        end_of_dataloader, remainder = False, -1

    class Inner:
        end_of_dataloader, remainder = True, 3

    state = GradientState()
    outer, inner = Outer(), Inner()
    state._add_dataloader(outer)
    state.register_dataloader(inner)
    assert state.active_dataloader is inner and state.end_of_dataloader and state.remainder == 3
    state._remove_dataloader(inner)
    assert state.active_dataloader is outer and not state.end_of_dataloader
    state.unregister_dataloader(outer)
    assert not state.in_dataloader and state.remainder == -1


def test_partial_state_is_initialized_is_asked_without_setting_up() -> None:
    assert not PartialState.is_initialized()
    assert not PartialState.is_initialized()  # asking did not set it up
    PartialState(cpu=True)
    assert PartialState.is_initialized() and AcceleratorState.is_initialized() and PartialState().initialized
    PartialState._reset_state()
    assert not PartialState.is_initialized()


def test_an_accelerator_made_before_a_reset_says_so() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    AcceleratorState._reset_state()
    with pytest.raises(RuntimeError, match=r"created before the state was reset"):
        accelerator.prepare(model)
    # The reference's test_reinstantiated_state expects an AttributeError naming the reset from prepare.
    with pytest.raises(AttributeError, match=r"This happens if `AcceleratorState._reset_state\(\)`") as raised:
        accelerator.prepare(model)
    assert "`AcceleratorState` object has no attribute" in str(raised.value)
    with pytest.raises(RuntimeError, match="Create a new `Accelerator\\(\\)`"):
        _ = accelerator.device
    stale = accelerator._state  # the state object the script may have kept
    with pytest.raises(AttributeError, match=r"AcceleratorState\._reset_state"):
        _ = stale.mixed_precision
    with pytest.raises(AttributeError, match=r"AcceleratorState\._reset_state"):
        _ = stale.distributed_type
    fresh = Accelerator(cpu=True)  # a new one works, and so does the kept state object again
    assert fresh.prepare(model) is not None and stale.mixed_precision == "no"

    kept = PartialState()
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(RuntimeError, match="_reset_state"):
        fresh.wait_for_everyone()
    with pytest.raises(AttributeError, match=r"`PartialState._reset_state\(\)` was called"):
        _ = kept.device


def test_state_of_an_accelerator_made_before_a_reset_can_be_reset_again() -> None:
    """Accelerate's test_metrics calls ``accelerator.state._reset_state()`` on an Accelerator made before an earlier
    reset: the property gives the state (whose fields are gone while it is reset), not an error."""
    accelerator = Accelerator(cpu=True)
    accelerator.state._reset_state()
    state = accelerator.state  # after the reset: still the process's state object
    assert isinstance(state, AcceleratorState)
    PartialState._reset_state()
    state = accelerator.state
    with pytest.raises(AttributeError, match=r"`AcceleratorState._reset_state\(\)` was called"):
        _ = state.mixed_precision
    with pytest.raises(AttributeError, match=r"`AcceleratorState._reset_state\(\)` was called"):
        _ = state.device
    accelerator.state._reset_state(True)  # the call test_metrics makes, on a state reset twice already
    with pytest.raises(RuntimeError, match="Create a new `Accelerator\\(\\)`"):
        _ = accelerator.device  # the Accelerator's own methods still refuse
    fresh = Accelerator(cpu=True)
    assert accelerator.state.mixed_precision == "no" and fresh.state is not None


class _TransformersLikeConfig:
    def __init__(self, distributed_config: object) -> None:
        self.distributed_config = distributed_config


def test_get_model_tp_size_reads_where_each_transformers_version_keeps_it() -> None:
    model = torch.nn.Linear(2, 2)
    assert get_model_tp_size(model) is None
    model.config = _TransformersLikeConfig({"tp_size": 4})  # transformers >= 5: a dict
    assert get_model_tp_size(model) == 4
    model.tp_size = 2  # transformers < 5
    assert get_model_tp_size(model) == 2
