"""Loading ``.pt`` / ``.bin`` files without running code from them.

Everything is read with ``torch.load(weights_only=True)``, which only rebuilds tensors, numpy arrays
and plain Python values. A file that needs anything else (a class, a function: what a malicious pickle uses
to run code) is refused with ``UnsafeCheckpointError`` naming what it asks for, unless the caller
opted in with ``allow_unsafe_pickle=True`` or ``ACCEL_ALLOW_UNSAFE_PICKLE=1`` (trusted legacy files).
"""

from __future__ import annotations

import os
import pickle
import struct
import warnings
import zipfile
from typing import Any

from .constants import UNSAFE_PICKLE_ENV
from .errors import CheckpointNotFoundError, CorruptCheckpointError, UnsafeCheckpointError
from .numpy_data import numpy_arrays_allowed

_OPT_IN = f"load_state(..., allow_unsafe_pickle=True) or set {UNSAFE_PICKLE_ENV}=1"


def unsafe_pickle_allowed(explicit: bool | None = None) -> bool:
    """The explicit argument wins; otherwise the environment variable decides (default: refuse)."""
    if explicit is not None:
        return bool(explicit)
    return os.environ.get(UNSAFE_PICKLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _corrupt(path: str, error: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{path} is truncated or corrupt ({type(error).__name__}: "
        f"{str(error).splitlines()[0] if str(error) else 'empty'}). Restore the file from a copy, or load an earlier "
        "checkpoint."
    )


def _unsafe_globals(path: str) -> list[str] | None:
    """The classes/functions the pickle in a torch zip file would import, found without running it."""
    import torch

    finder = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)
    if finder is None:
        return None
    try:
        with numpy_arrays_allowed():  # name only what is refused, not the numpy arrays that would load
            return list(finder(path))
    except Exception:  # noqa: BLE001 - any failure of the scan means "unknown", never an error
        return None


def load_torch_file(path: str, allow_unsafe_pickle: bool | None = None, mmap: bool = False) -> Any:
    """Loads a file written by ``torch.save`` onto the CPU, safely unless the opt-in is given.

    ``mmap=True`` leaves the tensors as views of a private memory map of the file (torch's zip
    format only; other files are read normally): reading costs nothing until the bytes are used.

    Example::

        state = load_torch_file("ckpt/optimizer.bin")                 # plain data only
        legacy = load_torch_file("old/random_states_0.pkl", True)     # trusted, may run code
    """
    import torch

    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"Missing file {path}: the checkpoint is incomplete or was written differently.")
    if os.path.getsize(path) == 0:
        raise _corrupt(path, EOFError("the file is empty"))
    is_zip = zipfile.is_zipfile(path)
    try:
        with numpy_arrays_allowed():
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    except pickle.UnpicklingError as error:
        if unsafe_pickle_allowed(allow_unsafe_pickle):
            return _load_unsafe(path, is_zip)
        if is_zip:
            found = _unsafe_globals(path)
            if found is None:
                raise _corrupt(path, error) from error
            what = ", ".join(found) if found else "pickle instructions outside the safe subset"
            raise UnsafeCheckpointError(
                f"Refused to load {path}: it is not plain data, loading it would import {what} and could run "
                f"arbitrary code. If you wrote this file yourself or trust its source: {_OPT_IN}. "
                "To keep such objects safe to load, make their state_dict() return tensors and plain Python values."
            ) from None
        if _looks_like_pickle(path):
            raise UnsafeCheckpointError(
                f"Refused to load {path}: it is a raw pickle (not a torch zip file), and unpickling it could run "
                f"arbitrary code. If it is a trusted legacy file: {_OPT_IN}."
            ) from None
        raise _corrupt(path, error) from error
    except (
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        OSError,
        ValueError,
        IndexError,
        KeyError,
        struct.error,
    ) as error:
        # Random bytes make torch's legacy reader fail in many ways (UnicodeDecodeError is a ValueError).
        raise _corrupt(path, error) from error


def _looks_like_pickle(path: str) -> bool:
    with open(path, "rb") as handle:
        return handle.read(1) == b"\x80"  # pickle protocol >= 2 starts with the PROTO opcode


def _load_unsafe(path: str, is_zip: bool) -> Any:
    import torch

    warnings.warn(
        f"Loading {path} with full unpickling (allow_unsafe_pickle): only do this for trusted files.", stacklevel=3
    )
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except RuntimeError:
        if is_zip:
            raise
    with open(path, "rb") as handle:  # a raw pickle.dump file, not torch's format
        return pickle.load(handle)  # explicit opt-in above
