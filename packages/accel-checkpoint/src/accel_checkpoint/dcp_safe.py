"""Reading ``torch.distributed.checkpoint`` (DCP) folders without unpickling arbitrary objects.

DCP's own reader loads its ``.metadata`` file with plain ``pickle.load`` and non-tensor values with
``torch.load(weights_only=False)``: a crafted DCP folder can run code. These subclasses keep DCP's
file format and planners but unpickle the metadata with an allow-list of DCP's own dataclasses,
and load non-tensor values with ``weights_only=True`` (unless the caller opted in).
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from .errors import CorruptCheckpointError, UnsafeCheckpointError
from .safe_load import unsafe_pickle_allowed

_ALLOWED: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "MetadataIndex",
        "StorageMeta",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # maps a layout's name to the layout object
    "torch": {"Size"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "pathlib._local":
            # Python 3.13 moved the path classes into pathlib._local and pickles them under that name; pathlib
            # re-exports them on every version, so a checkpoint saved on 3.13 also reads on 3.10-3.12.
            module = "pathlib"
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"Refused DCP metadata: it asks for {module}.{name}, which is not part of a DCP checkpoint's metadata "
            "and could run code. Load only checkpoints you trust with allow_unsafe_pickle=True."
        )


class SafeFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose metadata is unpickled with an allow-list, and whose file references stay inside the
    folder."""

    def __init__(self, path: str | os.PathLike[str], allow_unsafe_pickle: bool | None = None) -> None:
        super().__init__(path)
        self._allow_unsafe = unsafe_pickle_allowed(allow_unsafe_pickle)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if self._allow_unsafe:
            return super().read_metadata(*args, **kwargs)
        path = os.path.join(str(self.path), ".metadata")
        try:
            with open(path, "rb") as handle:
                metadata = _MetadataUnpickler(handle).load()
        except UnsafeCheckpointError as error:
            raise UnsafeCheckpointError(f"{path}: {error}") from None
        except FileNotFoundError as error:
            raise CorruptCheckpointError(f"{path} is missing: {self.path} is not a complete DCP checkpoint.") from error
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as error:
            raise CorruptCheckpointError(
                f"{path} is truncated or corrupt ({error}). Load an earlier checkpoint."
            ) from error
        for info in (getattr(metadata, "storage_data", None) or {}).values():
            rel = str(getattr(info, "relative_path", ""))
            if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/"):
                raise CorruptCheckpointError(f"{path} points outside its folder ({rel!r}); refusing to read it.")
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _load_value(value: io.BytesIO, allow_unsafe: bool) -> Any:
    try:
        return torch.load(value, weights_only=True)
    except pickle.UnpicklingError as error:
        if allow_unsafe:
            value.seek(0)
            return torch.load(value, weights_only=False)
        raise UnsafeCheckpointError(
            f"Refused a non-tensor value of a DCP checkpoint: it is not plain data ({str(error).splitlines()[0]}). "
            "Load only checkpoints you trust with allow_unsafe_pickle=True."
        ) from None


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that loads non-tensor values with ``weights_only=True``."""

    def __init__(self, allow_unsafe_pickle: bool | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._allow_unsafe = unsafe_pickle_allowed(allow_unsafe_pickle)

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = _load_value(value, self._allow_unsafe)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._traverse import (
                set_element,
            )  # DCP's own helper, as DefaultLoadPlanner uses it

            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def read_dcp_tensors(folder: str, prefix: str = "", allow_unsafe_pickle: bool | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a DCP folder whose flattened key starts with ``prefix``, in one process, on the CPU.

    Keys keep DCP's flattened dotted form, minus ``prefix``. Non-tensor values are skipped.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = SafeFileSystemReader(folder, allow_unsafe_pickle)
    metadata = reader.read_metadata()
    wanted: dict[str, torch.Tensor] = {}
    for key, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata) and key.startswith(prefix):
            wanted[key] = torch.empty(item.size, dtype=item.properties.dtype)
    reader = SafeFileSystemReader(folder, allow_unsafe_pickle)
    planner = SafeLoadPlanner(allow_unsafe_pickle)
    if "no_dist" in inspect.signature(dcp.load).parameters:
        dcp.load(wanted, storage_reader=reader, planner=planner, no_dist=True)
    else:
        # torch 2.6's dcp.load has no ``no_dist`` and, when a process group exists, reads collectively: one process
        # merging inside a distributed job would wait for the others. Its inner loader takes the switch.
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

        _load_state_dict(wanted, storage_reader=reader, planner=planner, no_dist=True)
    return {key[len(prefix) :]: value for key, value in wanted.items()}
