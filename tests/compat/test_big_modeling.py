"""Big-model loading on this CPU-only machine: the devices are "cpu" (with a memory budget) and "disk".

A model is trained-free but real: its outputs after loading and dispatching must equal the outputs
of the same weights in an ordinary module, whatever part is offloaded.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from accel import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
)
from accel.utils import (
    align_module_device,
    compute_module_sizes,
    find_tied_parameters,
    get_balanced_memory,
    has_offloaded_params,
)
from accel.utils.modeling import get_state_dict_from_offload


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.register_buffer("scale", torch.full((width,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x))) * self.scale


class TinyLM(nn.Module):
    """Embedding, blocks, and an output layer tied to the embedding (as language models do)."""

    def __init__(self, width: int = 32, depth: int = 6, vocab: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, vocab, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyLM, Path, torch.Tensor, torch.Tensor]:
    """Random weights saved as a sharded safetensors checkpoint (tied weight stored once), inputs, expected outputs."""
    from accel_checkpoint import write_model_files

    torch.manual_seed(0)
    model = TinyLM()
    folder = tmp_path_factory.mktemp("checkpoint")
    write_model_files(model.state_dict(), str(folder), max_shard_size=6000)
    ids = torch.randint(0, 64, (3, 7))
    with torch.no_grad():
        expected = model(ids)
    return model, folder, ids, expected


def empty_model() -> TinyLM:
    with init_empty_weights():
        model = TinyLM()
    model.tie_weights()  # registering a parameter under init_empty_weights makes a new one, as in the reference
    return model


def resident_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values() if t.device.type != "meta")


def test_empty_init_allocates_nothing() -> None:
    model = empty_model()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.blocks[0].scale.device.type == "cpu"  # buffers stay real unless include_buffers
    with init_empty_weights(include_buffers=True):
        assert TinyLM().blocks[0].scale.device.type == "meta"
    with init_on_device("cpu"):
        assert nn.Linear(2, 2).weight.device.type == "cpu"
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]


def test_model_larger_than_memory_runs_from_cpu_and_disk(trained, tmp_path: Path) -> None:
    _, checkpoint, ids, expected = trained
    total = compute_module_sizes(empty_model())[""]
    budget = total // 2  # the model does not fit in the CPU memory it is given
    model = load_checkpoint_and_dispatch(
        empty_model(), checkpoint, device_map="auto", max_memory={"cpu": budget},
        no_split_module_classes=["Block"], offload_folder=tmp_path / "offload",
    )  # fmt: skip
    devices = set(model.hf_device_map.values())
    assert devices == {"cpu", "disk"}, model.hf_device_map
    assert not any(k.startswith("blocks.") and k.count(".") > 1 for k in model.hf_device_map), "a Block was split"
    assert resident_bytes(model) <= budget
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    disk_tensors = [n for n in index if not n.endswith("scale")]  # buffers stay in memory (offload_buffers=False)
    assert disk_tensors and all((tmp_path / "offload" / index[n]["safetensors_file"]).is_file() for n in disk_tensors)
    with torch.no_grad():
        out = model(ids)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    offloaded = next(n for n, d in model.hf_device_map.items() if d == "disk")
    assert all(p.device.type == "meta" for p in model.get_submodule(offloaded).parameters()), (
        "weights not freed after use"
    )
    assert resident_bytes(model) <= budget
    with pytest.raises(RuntimeError, match="can't move a model that has some modules offloaded"):
        model.to("cpu")


@pytest.mark.parametrize("strategy", ["auto", "balanced", "balanced_low_0", "sequential"])
def test_device_map_strategies_and_tied_weights(trained, tmp_path: Path, strategy: str) -> None:
    _, checkpoint, ids, expected = trained
    budget = {"cpu": compute_module_sizes(empty_model())[""] // 3}
    model = load_checkpoint_and_dispatch(
        empty_model(), checkpoint, device_map=strategy, max_memory=budget, offload_folder=tmp_path / "off"
    )
    assert model.hf_device_map["embed"] == model.hf_device_map["head"] == "cpu"
    assert model.head.weight is model.embed.weight  # still one parameter after loading and dispatching
    assert get_balanced_memory(model, dict(budget)) == budget  # no GPU here: nothing to balance
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)


def test_everything_on_disk_with_offloaded_buffers(trained, tmp_path: Path) -> None:
    _, checkpoint, ids, expected = trained
    model = empty_model()
    load_checkpoint_in_model(model, checkpoint, device_map={"": "disk"}, offload_folder=tmp_path, offload_buffers=True)
    assert resident_bytes(model) == 0
    dispatch_model(model, {"": "disk"}, offload_dir=tmp_path, offload_buffers=True)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)
    assert resident_bytes(model) == 0


def test_dtype_and_checkpoint_forms(trained, tmp_path: Path) -> None:
    source, checkpoint, ids, expected = trained
    single = tmp_path / "model.safetensors"
    save_file(
        {k: v.contiguous() for k, v in source.state_dict().items() if k != "head.weight"},
        single,
        metadata={"format": "pt"},
    )
    torch.save(source.state_dict(), tmp_path / "pytorch_model.bin")
    for where in (single, tmp_path / "pytorch_model.bin", checkpoint / "model.safetensors.index.json", checkpoint):
        model = empty_model()
        load_checkpoint_in_model(model, where, device_map={"": "cpu"})
        with torch.no_grad():
            torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)
    half = empty_model()
    load_checkpoint_in_model(half, checkpoint, device_map={"": "cpu"}, dtype="float16")
    assert half.blocks[0].up.weight.dtype == torch.float16
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"not a folder containing a `\.index\.json` file"):
        load_checkpoint_in_model(empty_model(), tmp_path / "empty")
    with pytest.raises(ValueError, match="please pass along an `offload_folder`"):
        load_checkpoint_in_model(empty_model(), checkpoint, device_map={"": "disk"})
    with pytest.raises(ValueError, match="does not give any device for the following parameters: blocks"):
        dispatch_model(empty_model(), {"embed": "cpu", "head": "cpu"})


def test_cpu_and_disk_offload_load_weights_just_in_time(trained, tmp_path: Path) -> None:
    source, _, ids, expected = trained
    for offload in (
        lambda m: cpu_offload(m, execution_device="cpu"),
        lambda m: disk_offload(m, tmp_path, execution_device="cpu"),
    ):
        model = TinyLM()
        model.load_state_dict(source.state_dict())
        offload(model)
        assert all(p.device.type == "meta" for p in model.parameters())
        with torch.no_grad():
            torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)
        assert all(p.device.type == "meta" for p in model.parameters())


def test_preload_module_classes_loads_a_whole_block(trained, tmp_path: Path) -> None:
    class UsesChildWeight(nn.Module):  # reads its child's weight without calling the child
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.proj.weight.T

    torch.manual_seed(1)
    model = nn.Sequential(UsesChildWeight(), nn.Linear(4, 2))
    x = torch.randn(2, 4)
    expected = model(x).detach()
    disk_offload(model, tmp_path, execution_device="cpu", preload_module_classes=["UsesChildWeight"])
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_infer_auto_device_map_reserves_room_for_the_largest_layer(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(*[nn.Linear(10, 10) for _ in range(4)])  # 440 bytes per layer
    assert dict(infer_auto_device_map(model, {"cpu": 10_000})) == {"": "cpu"}
    # 1000 bytes: two layers fit, but one layer's room stays free for a disk layer brought in to run.
    assert dict(infer_auto_device_map(model, {"cpu": 1000})) == {"0": "cpu", "1": "disk", "2": "disk", "3": "disk"}
    with caplog.at_level(logging.INFO):
        assert dict(infer_auto_device_map(model, {"cpu": 400})) == {"": "disk"}
    assert "No module could be assigned to cpu" in caplog.text


def test_align_module_device_loads_an_offloaded_module_for_a_while(trained, tmp_path: Path) -> None:
    source, _, _, _ = trained
    model = TinyLM()
    model.load_state_dict(source.state_dict())
    disk_offload(model, tmp_path, execution_device="cpu")
    layer = model.blocks[2].up
    assert has_offloaded_params(layer) and not has_offloaded_params(model.blocks[2])  # hooks sit on tensor owners
    with align_module_device(layer):
        torch.testing.assert_close(layer.weight, source.blocks[2].up.weight, rtol=0, atol=0)
    assert layer.weight.device.type == "meta"
    plain = nn.Linear(2, 2)  # not offloaded: moved to execution_device and back (only the CPU exists here)
    before = plain.weight.detach().clone()
    with align_module_device(plain, execution_device="cpu"):
        assert plain.weight.device.type == "cpu"
    assert torch.equal(plain.weight, before)


def test_get_state_dict_from_offload_fills_a_disk_offloaded_models_state_dict(trained, tmp_path: Path) -> None:
    """transformers' save_pretrained of an offloaded model (transformers 4.x) walks every module this way."""
    source, _, _, _ = trained
    model = TinyLM()
    model.load_state_dict(source.state_dict())
    disk_offload(model, tmp_path, execution_device="cpu")
    state_dict = model.state_dict()
    assert state_dict["blocks.2.up.weight"].device.type == "meta"  # the offload engaged: nothing real before
    for name, module in model.named_modules():
        for key in module.state_dict():
            get_state_dict_from_offload(module, f"{name}.{key}" if name else key, state_dict)
    expected = source.state_dict()
    assert set(state_dict) == set(expected)
    for key, tensor in expected.items():
        assert state_dict[key].device.type == "cpu", key
        torch.testing.assert_close(state_dict[key], tensor, rtol=0, atol=0, msg=key)
    assert model.blocks[2].up.weight.device.type == "meta"  # the model itself stays offloaded
