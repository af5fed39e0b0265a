"""Reference-shaped arguments and API on one process: kwargs handlers, deepspeed_plugins, dynamo_plugin,
DDP hook settings, reduce, the state reset, and the properties scripts branch on."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch

from accel_core import (
    Accelerator,
    AcceleratorState,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientState,
    KwargsHandler,
    PartialState,
    ProfileKwargs,
    TorchDynamoPlugin,
)
from accel_core.ops import reduce


@dataclass
class UnknownKwargs(KwargsHandler):
    value: int = 0


def test_kwargs_handlers_apply_known_types_and_warn_about_others():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(kwargs_handlers=[UnknownKwargs(3), ProfileKwargs(with_flops=True)])
    assert [str(w.message) for w in caught if "UnknownKwargs" in str(w.message)], (
        "an unknown handler type is warned about"
    )
    assert UnknownKwargs not in accelerator.handlers and accelerator.profile_handler.with_flops
    assert accelerator.ddp_handler is None and accelerator.scaler_handler is None


def test_ddp_kwargs_hook_settings():
    handler = DistributedDataParallelKwargs(
        comm_hook="power_sgd", comm_wrapper="bf16", comm_state_option={"matrix_approximation_rank": 2}
    )
    assert handler.comm_hook is DDPCommunicationHookType.POWER_SGD and handler.comm_wrapper == "bf16"
    assert handler.to_kwargs() == {}  # the hook settings are not DistributedDataParallel arguments
    assert DistributedDataParallelKwargs(static_graph=True, comm_hook="fp16").to_kwargs() == {"static_graph": True}
    with pytest.raises(ValueError, match="is not a DDPCommunicationHookType"):
        DistributedDataParallelKwargs(comm_hook="int8")
    with pytest.raises(ValueError, match="wraps a comm_hook"):
        DistributedDataParallelKwargs(comm_wrapper="fp16")
    with pytest.raises(ValueError, match="'fp16' or 'bf16'"):
        DistributedDataParallelKwargs(comm_hook="fp16", comm_wrapper="power_sgd")
    with pytest.raises(ValueError, match="configures power-SGD"):
        DistributedDataParallelKwargs(comm_hook="fp16", comm_state_option={"matrix_approximation_rank": 2})


def test_deepspeed_plugins_shapes():
    with pytest.raises(ValueError, match="both `deepspeed_plugins` and `deepspeed_plugin`"):
        Accelerator(deepspeed_plugin=object(), deepspeed_plugins=object())
    with pytest.raises(ValueError, match="one DeepSpeed configuration per Accelerator"):
        Accelerator(deepspeed_plugins={"student": object(), "teacher": object()})
    with pytest.raises(ValueError, match="empty dict"):
        Accelerator(deepspeed_plugins={})
    assert Accelerator().deepspeed_plugin is None


def test_dynamo_plugin_compiles_and_conflicts_with_dynamo_backend():
    with pytest.raises(ValueError, match="both `dynamo_plugin` and `dynamo_backend`"):
        Accelerator(dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin(backend="eager"))
    with pytest.raises(ValueError, match="Unknown dynamo backend"):
        TorchDynamoPlugin(backend="warp")
    plugin = TorchDynamoPlugin(backend="EAGER", fullgraph=True, use_regional_compilation=True)
    assert plugin.to_kwargs() == {"backend": "eager", "fullgraph": True}
    accelerator = Accelerator(dynamo_plugin=plugin)
    assert accelerator.dynamo_plugin is plugin and accelerator.plan.dynamo_backend == "eager"

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = Stack()
    prepared = accelerator.prepare(model)
    # Regional compilation: each repeated block compiled on its own, the rest as a whole.
    assert all(type(b).__name__ == "OptimizedModule" for b in prepared.blocks)
    assert type(prepared.head).__name__ == "OptimizedModule" and type(prepared).__name__ == "Stack"
    x = torch.randn(2, 4)
    assert torch.allclose(prepared(x), model(x))
    whole = Accelerator(dynamo_backend="eager").prepare(torch.nn.Linear(2, 2))
    assert type(whole).__name__ == "OptimizedModule"


def test_reduce_defaults_and_choices():
    value = torch.tensor([2.0, 3.0])
    assert torch.equal(reduce(value), value) and reduce(value) is not value
    with pytest.raises(ValueError, match="max"):
        reduce(value, reduction="avg")


def test_accelerator_state_reset_keeps_the_process_state():
    Accelerator(mixed_precision="bf16")
    device = PartialState().device
    AcceleratorState._reset_state()
    assert PartialState().initialized and PartialState().device == device
    assert "mixed_precision" not in AcceleratorState._shared_state
    AcceleratorState._reset_state(reset_partial_state=True)
    assert not PartialState._shared_state
    GradientState._reset_state()


def test_gradient_accumulation_steps_setter_and_even_batches_setter():
    accelerator = Accelerator()
    accelerator.gradient_accumulation_steps = 3
    assert accelerator.gradient_accumulation_steps == 3 == GradientState().num_steps
    with pytest.raises(ValueError, match=">= 1"):
        accelerator.gradient_accumulation_steps = 0
    accelerator.even_batches = False
    assert accelerator.dataloader_config.even_batches is False
    GradientState._reset_state()


def test_single_process_properties_and_trigger():
    accelerator = Accelerator()
    assert not accelerator.multi_device and not accelerator.is_fsdp2 and accelerator.should_save_model
    assert not accelerator.check_trigger()
    accelerator.set_trigger()
    assert accelerator.check_trigger() and not accelerator.check_trigger()
    model = torch.nn.Linear(2, 1)
    with accelerator.trigger_sync_in_backward(model):  # not DDP: nothing to do
        model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None
