"""save_model's Hugging Face layout (sharded safetensors + index) and merging sharded checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from accel_checkpoint import load_model, merge_sharded_checkpoint, read_model_files, write_model_files
from accel_checkpoint.model_files import parse_size


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Embedding(100, 32), torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 100, bias=False)
    )
    model[3].weight = torch.nn.Parameter(model[0].weight.data)  # same shape [100, 32]: tie them
    model[3].weight = model[0].weight
    return model


def test_parse_size():
    assert parse_size("10GB") == 10 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size("500 MB") == 5 * 10**8
    assert parse_size(1234) == 1234
    with pytest.raises(ValueError, match="'10 parsecs' is not a size"):
        parse_size("10 parsecs")


def test_sharded_save_writes_the_hugging_face_layout(tmp_path):
    model = _model()
    names = write_model_files(model.state_dict(), str(tmp_path), max_shard_size="10KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards == sorted(n for n in names if n.endswith(".safetensors"))
    assert all(s.startswith("model-0000") and f"-of-{len(shards):05d}.safetensors" in s for s in shards)
    # total_size counts each stored tensor once: the tied LM head is not stored twice.
    stored = {}
    for shard in shards:
        stored.update(load_file(str(tmp_path / shard)))
        assert (
            os.path.getsize(tmp_path / shard) < 10_000 + 4 * 100 * 32 + 1024
        )  # a shard passes the limit only by one tensor
    assert "3.weight" not in stored and index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in stored.values()
    )
    assert set(index["weight_map"]) == set(stored)
    fresh = _model(seed=1)
    load_model(fresh, str(tmp_path))
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert fresh[3].weight is fresh[0].weight


def test_resaving_unsharded_removes_the_old_shards_and_index(tmp_path):
    model = _model()
    write_model_files(model.state_dict(), str(tmp_path), max_shard_size="10KB")
    (tmp_path / "config.json").write_text("{}")  # not ours: must stay
    write_model_files(model.state_dict(), str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]


def test_unsafe_serialization_writes_pytorch_model_bin(tmp_path):
    model = _model()
    write_model_files(model.state_dict(), str(tmp_path), max_shard_size="10KB", safe_serialization=False)
    assert (tmp_path / "pytorch_model.bin.index.json").exists()
    state = read_model_files(str(tmp_path))
    assert torch.equal(state["1.weight"], model[1].weight)


def test_merge_safetensors_shards_into_one_file(tmp_path):
    model = _model()
    write_model_files(model.state_dict(), str(tmp_path / "shards"), max_shard_size="10KB")
    out = merge_sharded_checkpoint(str(tmp_path / "shards"), str(tmp_path / "merged" / "model.safetensors"))
    merged = load_file(out)
    assert set(merged) == {"0.weight", "1.weight", "1.bias"}  # the alias is kept in the file metadata
    fresh = _model(seed=2)
    load_model(fresh, out)
    assert torch.equal(fresh[3].weight, model[0].weight)


def test_merge_a_dcp_folder(tmp_path):
    import torch.distributed.checkpoint as dcp

    model = _model()
    state = {k: v for k, v in model.state_dict().items() if k != "3.weight"}
    dcp.save(
        {"model": state}, checkpoint_id=str(tmp_path / "dcp")
    )  # no process group: DCP writes from this process alone
    out = merge_sharded_checkpoint(str(tmp_path / "dcp"), str(tmp_path / "out"))
    assert out.endswith(os.path.join("out", "model.safetensors"))
    merged = load_file(out)
    assert set(merged) == set(state) and all(torch.equal(merged[k], v) for k, v in state.items())


def test_dcp_metadata_with_a_foreign_global_is_refused(tmp_path):
    """DCP's own reader would unpickle ``.metadata`` blindly; ours refuses anything but DCP's dataclasses."""
    import pickle

    import torch.distributed.checkpoint as dcp

    from accel_checkpoint.errors import UnsafeCheckpointError

    dcp.save(
        {"model": {"w": torch.ones(2)}}, checkpoint_id=str(tmp_path / "dcp")
    )  # no process group: DCP writes from this process alone
    victim = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(victim), "w"))

    with open(tmp_path / "dcp" / ".metadata", "wb") as handle:
        pickle.dump(Payload(), handle)
    with pytest.raises(UnsafeCheckpointError, match=r"io\.open"):
        merge_sharded_checkpoint(str(tmp_path / "dcp"), str(tmp_path / "out"))
    assert not victim.exists()


def test_dcp_metadata_pickled_by_python_3_13_reads_on_every_version(tmp_path):
    """Python 3.13 pickles a path as ``pathlib._local.PosixPath`` (DCP's metadata holds the checkpoint's path): the
    allow-list accepts that name, and it reads on 3.10-3.12 too, where ``pathlib._local`` does not exist."""
    import pickle

    import torch.distributed.checkpoint as dcp

    state = {"w": torch.arange(6.0)}
    dcp.save(
        {"model": state}, checkpoint_id=str(tmp_path / "dcp")
    )  # no process group: DCP writes from this process alone
    metadata_file = tmp_path / "dcp" / ".metadata"
    with open(metadata_file, "rb") as handle:
        metadata = pickle.load(handle)
    # Protocol 2 names each class on a text line, so the module can be rewritten to 3.13's spelling.
    text = pickle.dumps(metadata, protocol=2)
    module = b"pathlib._local" if b"cpathlib._local\n" in text else b"pathlib"
    assert text.count(b"c" + module + b"\nPosixPath\n") == 1, "DCP's metadata no longer holds a path"
    metadata_file.write_bytes(text.replace(b"c" + module + b"\n", b"cpathlib._local\n"))
    merged = load_file(merge_sharded_checkpoint(str(tmp_path / "dcp"), str(tmp_path / "out")))
    assert set(merged) == {"w"} and torch.equal(merged["w"], state["w"])
