"""The streaming safetensors writer, checked with the reference safetensors reader."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from accel_checkpoint.errors import CorruptCheckpointError
from accel_checkpoint.safetensors_io import dedupe, read_safetensors, safetensors_metadata, write_safetensors

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def test_every_dtype_round_trips_through_the_reference_reader(tmp_path):
    torch.manual_seed(0)
    tensors = {}
    for dtype in DTYPES:
        if dtype.is_floating_point:
            tensors[str(dtype)] = torch.randn(3, 5).to(dtype)
        elif dtype == torch.bool:
            tensors[str(dtype)] = torch.rand(7) > 0.5
        else:
            tensors[str(dtype)] = torch.randint(0, 100, (4, 2), dtype=dtype)
    tensors["scalar"] = torch.tensor(3.5)
    tensors["empty"] = torch.zeros(0, 4)
    tensors["transposed"] = torch.arange(12.0).reshape(3, 4).t()  # not contiguous
    path = str(tmp_path / "t.safetensors")
    size = write_safetensors(tensors, path, {"format": "pt", "note": "x"})
    assert size == os.path.getsize(path)
    loaded = load_file(path)
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(path, framework="pt") as handle:
        assert handle.metadata() == {"format": "pt", "note": "x"}


def test_tied_weights_are_written_once_and_restored_for_strict_loading(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as in language models
    unique, aliases = dedupe(model.state_dict())
    assert aliases == {"1.weight": "0.weight"} and list(unique) == ["0.weight"]
    path = str(tmp_path / "m.safetensors")
    write_safetensors(unique, path, safetensors_metadata(aliases))
    state, _ = read_safetensors(path)
    fresh = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    fresh[1].weight = fresh[0].weight
    fresh.load_state_dict(state, strict=True)
    assert torch.equal(fresh[1].weight, model[0].weight)


def test_partially_overlapping_views_are_stored_as_separate_tensors(tmp_path):
    base = torch.arange(10.0)
    unique, aliases = dedupe({"a": base[:6], "b": base[4:]})
    assert aliases == {}
    path = str(tmp_path / "v.safetensors")
    write_safetensors(unique, path)
    loaded = load_file(path)
    assert torch.equal(loaded["a"], base[:6]) and torch.equal(loaded["b"], base[4:])


def test_non_tensor_entries_are_refused_with_the_fix():
    with pytest.raises(TypeError, match="safe_serialization=False"):
        dedupe({"w": torch.ones(1), "_extra_state": {"a": 1}})


def test_truncated_file_names_the_file(tmp_path):
    path = str(tmp_path / "big.safetensors")
    write_safetensors({"w": torch.randn(1000)}, path)
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CorruptCheckpointError, match=r"big\.safetensors is truncated or corrupt"):
        read_safetensors(path)


def test_files_of_the_reference_writer_read_back(tmp_path):
    from safetensors.torch import save_file

    tensors = {
        "a": torch.randn(3, 3),
        "h": torch.randn(5).half(),
        "b": torch.randn(2).bfloat16(),
        "i": torch.arange(7),
        "m": torch.rand(3) > 0.5,
    }
    path = str(tmp_path / "ref.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    loaded, metadata = read_safetensors(path)
    assert metadata == {"format": "pt"} and all(torch.equal(loaded[k], v) for k, v in tensors.items())
    loaded["a"].zero_()  # a private mapping: the file does not change
    assert torch.equal(load_file(path)["a"], tensors["a"])


def _craft(path, header: dict, data: bytes) -> None:
    import json
    import struct

    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize(
    "header, data, why",
    [
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            "does not start where",
        ),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "do not match its shape"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "describes"),
        ({"a": {"dtype": "PY_OBJECT", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "bad dtype"),
    ],
)
def test_malformed_headers_are_rejected(tmp_path, header, data, why):
    path = str(tmp_path / "bad.safetensors")
    _craft(path, header, data)
    with pytest.raises(CorruptCheckpointError, match=why):
        read_safetensors(path)


def test_absurd_header_length_is_rejected(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(CorruptCheckpointError, match="header length"):
        read_safetensors(str(path))


def test_accelerator_save_with_safe_serialization_writes_tied_weights_once(tmp_path):
    """``accelerator.save(..., safe_serialization=True)`` goes through accel-checkpoint (accel-core does not depend on
    safetensors): a state dict whose weights share storage (tied embeddings) is written, each storage once."""
    from accel_core import Accelerator

    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied: one storage under two names
    accelerator = Accelerator(cpu=True)
    path = tmp_path / "model.safetensors"
    accelerator.save(model.state_dict(), path, safe_serialization=True)
    written = load_file(path)
    assert list(written) == ["0.weight"]
    assert torch.equal(written["0.weight"], model[0].weight.detach())
    accelerator.save({"w": torch.ones(2)}, tmp_path / "plain.bin")  # the pickle path stays torch.save
    assert torch.equal(torch.load(tmp_path / "plain.bin")["w"], torch.ones(2))
