"""Checkpoint content is verified on load (a hash per file) and an optimizer state saved for another
optimizer class is refused naming both classes."""

from __future__ import annotations

import json
import os

import pytest
import torch

from accel_checkpoint.content_hash import ALGORITHM, hash_file
from accel_checkpoint.errors import CheckpointMismatchError, CorruptCheckpointError
from accel_core import Accelerator


def read_json(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


def write_json(path: str, data: dict) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def make(accelerator, optimizer_class=torch.optim.AdamW):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Linear(16, 2))
    optimizer = optimizer_class(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()  # an optimizer with state
    optimizer.zero_grad()
    return model, optimizer


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_overwritten_tail_of_the_weights_is_refused(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, _ = make(accelerator)
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    manifest = read_json(os.path.join(folder, "accel_checkpoint.json"))
    assert manifest["hash_algorithm"] == ALGORITHM and set(manifest["hashes"]) == set(manifest["files"])
    path = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:  # what the issue found loading silently as NaN weights
        handle.seek(size - 8)
        handle.write(b"\xff" * 8)
    assert os.path.getsize(path) == size
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    before = weights(model)
    with pytest.raises(
        CorruptCheckpointError,
        match=r"model\.safetensors does not hold the bytes that were written.*truncated or changed",
    ):
        accelerator.load_state(folder)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing was half-loaded


def test_a_flipped_byte_in_any_file_is_refused_and_older_checkpoints_still_load(tmp_path):
    accelerator = Accelerator(cpu=True)
    model, _ = make(accelerator)
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    manifest_path = os.path.join(folder, "accel_checkpoint.json")
    manifest = read_json(manifest_path)
    for name in manifest["files"]:
        path = os.path.join(folder, name)
        original = read_bytes(path)
        flipped = bytearray(original)
        flipped[len(flipped) // 2] ^= 0x01
        write_bytes(path, bytes(flipped))
        with pytest.raises(CorruptCheckpointError, match=rf"{name.replace('.', '[.]')} does not hold the bytes"):
            accelerator.load_state(folder)
        write_bytes(path, original)
    accelerator.load_state(folder)  # restored: loads
    # A checkpoint written before hashes existed (no "hashes" in its manifest) loads as before.
    del manifest["hashes"], manifest["hash_algorithm"]
    write_json(manifest_path, manifest)
    weights_path = os.path.join(folder, "model.safetensors")
    assert hash_file(weights_path)  # unchanged file, nothing recorded to compare with
    expected = weights(model)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(folder)
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_optimizer_state_of_another_class_names_both(tmp_path):
    saver = Accelerator(cpu=True)
    make(saver, torch.optim.SGD)
    folder = saver.save_state(str(tmp_path / "sgd"))
    loader = Accelerator(cpu=True)
    make(loader, torch.optim.Adam)
    with pytest.raises(
        CheckpointMismatchError,
        match=r"optimizer\.bin holds the state of a torch\.optim\.sgd\.SGD optimizer.*is a torch\.optim\.adam\.Adam",
    ):
        loader.load_state(folder)
    # Older checkpoints (no class recorded) load as before.
    manifest_path = os.path.join(folder, "accel_checkpoint.json")
    manifest = read_json(manifest_path)
    del manifest["optimizer_classes"]
    write_json(manifest_path, manifest)
    same = Accelerator(cpu=True)
    make(same, torch.optim.SGD)
    same.load_state(folder)
