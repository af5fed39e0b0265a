"""Safe loading: plain data loads, code-running pickles are refused unless explicitly allowed."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from accel_checkpoint import UNSAFE_PICKLE_ENV
from accel_checkpoint.errors import CorruptCheckpointError, UnsafeCheckpointError
from accel_checkpoint.safe_load import load_torch_file


class _CreatesFile:
    """A malicious payload: unpickling it runs ``open(path, 'w')``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class TrustedLegacyObject:
    def __init__(self, value: int = 3) -> None:
        self.value = value


def test_plain_data_loads(tmp_path):
    path = str(tmp_path / "ok.pt")
    torch.save({"t": torch.arange(3), "lr": 0.1, "betas": (0.9, 0.99), "name": "adam", "none": None}, path)
    loaded = load_torch_file(path)
    assert torch.equal(loaded["t"], torch.arange(3)) and loaded["betas"] == (0.9, 0.99)


def test_numpy_arrays_load_and_other_registrations_are_left_alone(tmp_path):
    """numpy arrays are data whatever the process imported before; a global another library allow-listed
    (megatron-core registers numpy's at import) stays registered after accel's load."""
    import numpy as np

    from accel_checkpoint.user_io import load

    path = str(tmp_path / "arrays.pt")
    torch.save({"state": np.random.get_state(), "values": np.arange(4.0)}, path)
    registered = np.ndarray
    torch.serialization.add_safe_globals([registered])
    try:
        assert np.array_equal(load_torch_file(path)["values"], np.arange(4.0))
        assert np.array_equal(load(path)["values"], np.arange(4.0))
        assert any(g is registered for g in torch.serialization.get_safe_globals())
    finally:
        torch.serialization.clear_safe_globals()
    assert np.array_equal(load_torch_file(path)["values"], np.arange(4.0))
    assert torch.serialization.get_safe_globals() == []


@pytest.mark.parametrize("raw_pickle", [False, True])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, raw_pickle, monkeypatch):
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    victim = tmp_path / "pwned"
    path = str(tmp_path / "optimizer.bin")
    payload = {"state": _CreatesFile(str(victim))}
    if raw_pickle:
        with open(path, "wb") as handle:
            pickle.dump(payload, handle)
    else:
        torch.save(payload, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_torch_file(path)
    message = str(info.value)
    assert "optimizer.bin" in message and "allow_unsafe_pickle=True" in message and UNSAFE_PICKLE_ENV in message
    if not raw_pickle:
        assert "io.open" in message  # names what it would have imported
    assert not victim.exists()


def test_opt_in_loads_trusted_legacy_objects(tmp_path, monkeypatch):
    path = str(tmp_path / "custom_checkpoint_0.pkl")
    torch.save({"obj": TrustedLegacyObject(7)}, path)
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    with pytest.raises(UnsafeCheckpointError, match="TrustedLegacyObject"):
        load_torch_file(path)
    with pytest.warns(UserWarning, match="trusted"):
        assert load_torch_file(path, allow_unsafe_pickle=True)["obj"].value == 7
    monkeypatch.setenv(UNSAFE_PICKLE_ENV, "1")
    with pytest.warns(UserWarning):
        assert load_torch_file(path)["obj"].value == 7
    # The explicit argument wins over the environment.
    with pytest.raises(UnsafeCheckpointError):
        load_torch_file(path, allow_unsafe_pickle=False)


def test_raw_pickle_legacy_file_loads_with_opt_in(tmp_path):
    path = str(tmp_path / "random_states_0.pkl")
    with open(path, "wb") as handle:
        pickle.dump({"step": 4}, handle)
    with pytest.warns(UserWarning):
        assert load_torch_file(path, allow_unsafe_pickle=True) == {"step": 4}


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_corrupt_files_name_the_file_and_the_fix(tmp_path, damage):
    path = str(tmp_path / "scheduler.bin")
    torch.save({"t": torch.randn(1000)}, path)
    data = Path(path).read_bytes()
    with open(path, "wb") as handle:
        handle.write(
            {"truncate": data[: len(data) // 2], "empty": b"", "garbage": os.urandom(300).replace(b"\x80", b"\x00")}[
                damage
            ]
        )
    with pytest.raises(CorruptCheckpointError, match=r"scheduler\.bin is truncated or corrupt.*earlier checkpoint"):
        load_torch_file(path)
