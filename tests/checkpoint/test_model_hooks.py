"""Accelerate's ModelHook objects (accel.hooks): forward wrapping, weights offloaded and loaded per call, whole-model
offload with cpu_offload_with_hook. On CPU the "other device" is meta (a real move: the tensors lose their storage);
the GPU test runs where CUDA is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel import cpu_offload_with_hook
from accel.hooks import (
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from accel.utils import OffloadedWeightsLoader, offload_state_dict


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.second = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.second(self.norm(self.first(x))) * scale


class Recorder(ModelHook):
    """Adds ``add`` to the first argument and doubles the output; records the events it saw."""

    def __init__(self, add: float, events: list[str]) -> None:
        self.add = add
        self.events = events

    def init_hook(self, module: nn.Module) -> nn.Module:
        self.events.append(f"init {self.add}")
        return module

    def pre_forward(self, module, *args, **kwargs):
        self.events.append(f"pre {self.add}")
        return (args[0] + self.add, *args[1:]), kwargs

    def post_forward(self, module, output):
        self.events.append(f"post {self.add}")
        return output * 2

    def detach_hook(self, module: nn.Module) -> nn.Module:
        self.events.append(f"detach {self.add}")
        return module


class Spy(ModelHook):
    """Records the devices of the first input and of the module's weight as the forward sees them."""

    def __init__(self) -> None:
        self.input_devices: list[torch.device] = []
        self.weight_devices: list[torch.device] = []

    def pre_forward(self, module, *args, **kwargs):
        self.input_devices.append(args[0].device)
        self.weight_devices.append(module.weight.device)
        return args, kwargs


def test_add_hook_wraps_forward_with_kwargs_and_remove_restores_it() -> None:
    layer = nn.Linear(2, 2)
    original = layer.forward
    x = torch.ones(1, 2)
    plain = layer(x)
    events: list[str] = []
    add_hook_to_module(layer, Recorder(1.0, events))
    assert isinstance(layer._hf_hook, Recorder) and layer._old_forward == original
    torch.testing.assert_close(layer(x), layer._old_forward(x + 1.0) * 2)
    assert events == ["init 1.0", "pre 1.0", "post 1.0"]
    remove_hook_from_module(layer)
    assert events[-1] == "detach 1.0"
    assert not hasattr(layer, "_hf_hook") and not hasattr(layer, "_old_forward")
    assert layer.forward == original
    torch.testing.assert_close(layer(x), plain)


def test_append_chains_hooks_and_replacing_keeps_the_original_forward() -> None:
    layer = nn.Linear(2, 2)
    x = torch.zeros(1, 2)
    events: list[str] = []
    add_hook_to_module(layer, Recorder(1.0, events))
    add_hook_to_module(layer, Recorder(2.0, events), append=True)
    assert isinstance(layer._hf_hook, SequentialHook) and len(layer._hf_hook.hooks) == 2
    out = layer(x)
    torch.testing.assert_close(out, layer._old_forward(x + 3.0) * 4)  # both pre_forwards, both post_forwards
    assert events[-4:] == ["pre 1.0", "pre 2.0", "post 1.0", "post 2.0"]
    # Without append the new hook replaces the chain; the forward underneath is still the module's own.
    add_hook_to_module(layer, Recorder(5.0, events))
    torch.testing.assert_close(layer(x), layer._old_forward(x + 5.0) * 2)
    assert layer._old_forward.__self__ is layer  # the bound nn.Linear.forward, not a hooked one
    remove_hook_from_module(layer)
    torch.testing.assert_close(layer(x), nn.Linear.forward(layer, x))


def test_no_grad_hook_runs_forward_without_graph() -> None:
    class NoGrad(ModelHook):
        no_grad = True

    layer = nn.Linear(2, 2)
    add_hook_to_module(layer, NoGrad())
    assert not layer(torch.ones(1, 2)).requires_grad


def test_align_devices_hook_offloads_weights_between_calls() -> None:
    model = Net().eval()
    x = torch.randn(5, 4)
    expected = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attach_align_device_hook(model, execution_device="cpu", offload=True, offload_buffers=True)
    # Every weight and (persistent) buffer now lives on meta; each module's hook holds a CPU copy.
    assert {t.device.type for t in model.state_dict().values()} == {"meta"}
    assert isinstance(model.first._hf_hook, AlignDevicesHook) and model.first._hf_hook.offload
    assert set(model.first._hf_hook.weights_map) == {"weight", "bias"}
    spy = Spy()
    add_hook_to_module(model.first, spy, append=True)  # runs after the AlignDevicesHook's pre_forward
    torch.testing.assert_close(model(x), expected)
    assert spy.weight_devices == [torch.device("cpu")]  # loaded for the call...
    assert model.first.weight.device.type == "meta"  # ...and off again after it
    remove_hook_from_submodules(model)
    # Detaching puts each tensor back where it was, with its values.
    assert {t.device.type for t in model.state_dict().values()} == {"cpu"}
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name])
    assert model.first.forward.__func__ is nn.Linear.forward and not hasattr(model.first, "_hf_hook")


def test_align_devices_hook_reads_weights_from_an_offload_folder(tmp_path) -> None:
    model = Net().eval()
    x = torch.randn(3, 4)
    expected = model(x)
    offload_state_dict(tmp_path, model.state_dict())
    weights = OffloadedWeightsLoader(save_folder=tmp_path)
    with torch.device("meta"):
        empty = Net().eval()
    attach_align_device_hook(empty, execution_device="cpu", offload=True, weights_map=weights, offload_buffers=True)
    assert empty.second.weight.device.type == "meta"
    torch.testing.assert_close(empty(x), expected)
    assert empty.second.weight.device.type == "meta"


def test_align_devices_hook_moves_inputs_and_brings_the_output_back() -> None:
    layer = nn.Linear(2, 2)
    add_hook_to_module(layer, AlignDevicesHook(execution_device="meta", io_same_device=True))
    assert layer.weight.device.type == "meta"  # placed once at init (not offloaded)
    spy = Spy()
    add_hook_to_module(layer, spy, append=True)
    with pytest.raises(NotImplementedError):  # meta output cannot come back to the CPU: the move was attempted
        layer(torch.ones(1, 2))
    assert spy.input_devices == [torch.device("meta")]
    # Without io_same_device the output stays on the execution device.
    other = nn.Linear(2, 2)
    add_hook_to_module(other, AlignDevicesHook(execution_device="meta"))
    assert other(torch.ones(1, 2)).device.type == "meta"


def test_hook_without_execution_device_leaves_inputs_alone() -> None:
    """transformers' generate attaches ``AlignDevicesHook(io_same_device=True)`` to an encoder that has no hook."""
    layer = nn.Linear(2, 2)
    add_hook_to_module(layer, AlignDevicesHook(io_same_device=True))
    torch.testing.assert_close(layer(torch.ones(1, 2)), nn.Linear.forward(layer, torch.ones(1, 2)))


def test_cpu_offload_moves_the_model_to_the_execution_device_when_it_runs() -> None:
    model = nn.Linear(3, 3)
    model, hook = cpu_offload_with_hook(model, execution_device="meta")
    assert isinstance(model._hf_hook, CpuOffload) and hook.model is model
    assert model.weight.device.type == "cpu"  # init_hook: on the CPU until it runs
    out = model(torch.ones(2, 3))  # the input follows the model to the execution device
    assert model.weight.device.type == "meta" and out.device.type == "meta"
    assert model(torch.ones(2, 3, device="meta")).device.type == "meta"  # stays there between calls
    hook.remove()
    assert not hasattr(model, "_hf_hook") and model.forward.__func__ is nn.Linear.forward


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the model moves between CPU and GPU")
def test_cpu_offload_with_hook_pipeline_on_gpu() -> None:
    first, second = nn.Linear(3, 3), nn.Linear(3, 3)
    first, hook_1 = cpu_offload_with_hook(first, "cuda:0")
    second, hook_2 = cpu_offload_with_hook(second, "cuda:0", prev_module_hook=hook_1)
    hidden = first(torch.ones(2, 3))
    assert first.weight.device.type == "cuda" and hidden.device.type == "cuda"
    second(hidden)
    assert first.weight.device.type == "cpu" and second.weight.device.type == "cuda"  # first went back to the CPU
    hook_2.offload()
    assert second.weight.device.type == "cpu"
