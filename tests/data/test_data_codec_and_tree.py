"""The dispatcher's wire format and the batch-tree operations, in one process."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

from accel_data._tree import BatchTypeError, batch_size, concat_batches, slice_batch, to_device
from accel_data.dispatch import decode, encode


def round_trip(obj, offset: int = 0):
    buf, end = encode(obj, offset, size_at_least=1024)
    assert buf.numel() >= max(end, 1024)
    return decode(buf[:end], offset)


Pair = namedtuple("Pair", ["inputs", "labels"])


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def test_codec_round_trips_every_kind_of_batch() -> None:
    batch = {
        "ids": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "mask": torch.tensor([[True, False, True]]),
        "half": torch.randn(2, 5).half(),
        "bf16": torch.randn(3).bfloat16(),
        "complex": torch.randn(2, dtype=torch.complex128),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 7),
        "strided": torch.arange(20.0).reshape(4, 5).t(),  # not contiguous
        "names": ["a", "bé", "c"],
        "meta": {"lengths": [3, 1, 2], "source": None},
        "pair": Pair(torch.ones(2, 1, dtype=torch.uint8), (torch.zeros(1), 7)),
    }
    out = decode(*encode(batch)[:1])
    _same(batch, out)
    _same(batch, round_trip(batch, offset=32))
    assert round_trip(["just", "strings"]) == ["just", "strings"]
    assert round_trip(None) is None


def test_codec_tensors_are_aligned_views() -> None:
    buf, _ = encode([torch.ones(3, dtype=torch.uint8), torch.arange(5, dtype=torch.float64)], 32)
    out = decode(buf, 32)
    assert out[1].data_ptr() % 8 == 0
    assert out[1].untyped_storage().data_ptr() == buf.untyped_storage().data_ptr(), "decoded without a copy"


def test_variable_shapes_between_batches() -> None:
    for length in (1, 7, 33):
        batch = {"input_ids": torch.randint(0, 100, (4, length)), "label": torch.arange(4)}
        _same(batch, round_trip(batch, offset=32))


def test_tree_size_slice_concat() -> None:
    batch = {
        "x": torch.arange(6).reshape(3, 2),
        "names": ["a", "b", "c"],
        "pair": (torch.arange(3), np.arange(3)),
        "k": 1,
    }
    assert batch_size(batch) == 3
    part = slice_batch(batch, 1, 3)
    assert part["x"].tolist() == [[2, 3], [4, 5]] and part["names"] == ["b", "c"] and part["k"] == 1
    assert part["pair"][1].tolist() == [1, 2]
    joined = concat_batches([part, slice_batch(batch, 0, 1)])
    assert joined["names"] == ["b", "c", "a"] and joined["x"][:, 0].tolist() == [2, 4, 0]
    assert batch_size(["a", "b"]) == 2 and batch_size([[1, 2], [3]]) == 2, "lists of per-sample items are columns"
    assert batch_size([torch.zeros(5, 2), torch.zeros(5)]) == 5, "a list of tensors is a structure"
    assert batch_size(object()) is None
    with pytest.raises(BatchTypeError, match="collate_fn"):
        slice_batch(object(), 0, 1)


def test_to_device_keeps_structure() -> None:
    batch = Pair(torch.ones(2), {"a": [torch.zeros(1), "s"]})
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved, Pair) and moved.labels["a"][1] == "s"
