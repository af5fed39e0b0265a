"""Weights kept off the execution device: in CPU memory, or as safetensors files in an offload folder.

The folder holds one ``<name>.safetensors`` file per tensor and an ``index.json`` that maps each
weight name (tied names included) to its file and its key in that file. An index entry may also
point into the original checkpoint's safetensors files, so nothing is copied.

Example::

    offload_state_dict("offload", {"layer.weight": torch.ones(2, 2)})
    weights = OffloadedWeightsLoader(save_folder="offload")
    weights["layer.weight"]           # read from offload/layer.weight.safetensors now
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..user_io import id_tensor_storage

INDEX_NAME = "index.json"


def _entry(file: str, key: str, tensor: torch.Tensor) -> dict[str, Any]:
    return {
        "safetensors_file": file,
        "weight_name": key,
        "dtype": str(tensor.dtype).replace("torch.", ""),
        "shape": list(tensor.shape),
    }


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike[str], index: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Writes ``weight`` to ``<offload_folder>/<weight_name>.safetensors`` and records it in ``index`` (returned)."""
    from safetensors.torch import save_file

    index = {} if index is None else index
    file = f"{weight_name}.safetensors"
    save_file({weight_name: weight.detach().to("cpu").contiguous()}, os.path.join(offload_folder, file))
    index[weight_name] = _entry(file, weight_name, weight)
    return index


def save_offload_index(index: dict[str, Any], offload_folder: str | os.PathLike[str]) -> None:
    """Adds ``index`` to ``<offload_folder>/index.json`` (entries already there stay unless replaced)."""
    if not index:
        return
    path = os.path.join(offload_folder, INDEX_NAME)
    current = json.loads(Path(path).read_text()) if os.path.isfile(path) else {}
    current.update(index)
    with open(path, "w") as f:
        json.dump(current, f, indent=2)


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: dict[str, torch.Tensor]) -> None:
    """Writes every tensor of ``state_dict`` to ``save_dir``; names sharing one storage (tied) share one file."""
    os.makedirs(save_dir, exist_ok=True)
    index: dict[str, Any] = {}
    written: dict[Any, str] = {}
    for name, tensor in state_dict.items():
        storage = id_tensor_storage(tensor) if tensor.device.type != "meta" else None
        if storage is not None and storage in written and state_dict[written[storage]].shape == tensor.shape:
            index[name] = index[written[storage]]
            continue
        offload_weight(tensor, name, save_dir, index=index)
        if storage is not None:
            written[storage] = name
    save_offload_index(index, save_dir)


def extract_submodules_state_dict(
    state_dict: dict[str, torch.Tensor], submodule_names: list[str]
) -> dict[str, torch.Tensor]:
    """The entries of ``state_dict`` that belong to one of ``submodule_names`` (or are one of them)."""
    return {
        key: value
        for key, value in state_dict.items()
        if any(key == name or key.startswith(name + ".") for name in submodule_names)
    }


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """A read-only mapping from weight name to tensor over CPU weights (``state_dict``) and an offload folder.

    Tensors on disk are read when asked for (onto ``device`` if given, else the CPU), never cached.
    index: the folder's index (default: read ``<save_folder>/index.json``); relative file names
    are resolved against ``save_folder``.
    """

    def __init__(
        self,
        state_dict: dict[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike[str] | None = None,
        index: Mapping[str, Any] | None = None,
        device: Any = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index.")
        self.state_dict = {} if state_dict is None else state_dict
        self.save_folder = None if save_folder is None else os.fspath(save_folder)
        if (
            index is None
            and self.save_folder is not None
            and os.path.isfile(os.path.join(self.save_folder, INDEX_NAME))
        ):
            index = json.loads(Path(self.save_folder, INDEX_NAME).read_text())
        self.index = {} if index is None else dict(index)
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]
        self.device = device

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        if key not in self.index:
            raise KeyError(key)
        from safetensors import safe_open

        entry = self.index[key]
        if "safetensors_file" not in entry:
            raise ValueError(
                f"Offloaded weight {key!r} is not in a safetensors file (an offload folder of the reference's .dat "
                "format?): offload the model again with accel."
            )
        file = entry["safetensors_file"]
        if not os.path.isabs(file) and self.save_folder is not None:
            file = os.path.join(self.save_folder, file)
        device = (
            "cpu"
            if self.device is None
            else str(torch.device(self.device) if isinstance(self.device, int) else self.device)
        )
        with safe_open(file, framework="pt", device=device) as f:
            return f.get_tensor(entry.get("weight_name", key))

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)


def load_offloaded_weights(
    model: nn.Module, index: Mapping[str, Any] | None, offload_folder: str | os.PathLike[str]
) -> None:
    """Loads every weight of ``index`` (an offload folder's index, as ``offload_weight`` / ``offload_state_dict``
    write it) from ``offload_folder`` into ``model``, on the CPU. An empty or None index loads nothing."""
    if not index:
        return
    weights = OffloadedWeightsLoader(save_folder=offload_folder, index=index)
    for name in index:
        set_module_tensor_to_device(model, name, "cpu", value=weights[name])


class PrefixedDataset(Mapping[str, Any]):
    """The view of ``dataset`` (a mapping) under ``prefix``: ``PrefixedDataset(weights, "layer.")["weight"]``."""

    def __init__(self, dataset: Mapping[str, Any], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Any:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter(k[len(self.prefix) :] for k in self.dataset if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for k in self.dataset if k.startswith(self.prefix))


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Puts the parameter or buffer ``tensor_name`` (dotted, from ``module``) on ``device``, with ``value`` if given.

    A parameter stays a parameter of the same class and ``requires_grad`` (``param.to(...)`` would
    not). ``value`` is cast to ``dtype``, or to the current tensor's dtype (integer and bool values
    keep theirs). Moving a meta tensor needs a ``value``. ``fp16_statistics`` (8-bit weights) is not
    supported; ``tied_params_map`` and ``clear_cache`` are accepted for the reference's signature.
    """
    if fp16_statistics is not None:
        raise ValueError(
            "set_module_tensor_to_device(fp16_statistics=...) is for bitsandbytes 8-bit weights, which accel does not "
            "load."
        )
    owner_name, _, name = tensor_name.rpartition(".")
    owner = module.get_submodule(owner_name)
    if name not in owner._parameters and name not in owner._buffers:
        raise ValueError(f"{owner} does not have a parameter or a buffer named {name}.")
    old = getattr(owner, name)
    if value is None and old.device.type == "meta" and str(device) != "meta":
        raise ValueError(f"{tensor_name} is on the meta device, we need a `value` to put in on {device}.")
    if value is not None:
        if old.shape != value.shape:
            raise ValueError(
                f'Trying to set a tensor of shape {value.shape} in "{tensor_name}" (which has shape {old.shape}), this '
                "looks incorrect."
            )
        if dtype is None:
            value = value.to(old.dtype)
        elif not str(value.dtype).startswith(("torch.uint", "torch.int", "torch.bool")):
            value = value.to(
                dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype).replace("torch.", ""))
            )
    with torch.no_grad():
        new = (old if value is None else value).to(device, non_blocking=non_blocking)
        if name in owner._buffers:
            owner._buffers[name] = new
        else:
            param = owner._parameters[name]
            assert param is not None  # `name` is one of owner's tensors (found above)
            owner._parameters[name] = type(param)(new, requires_grad=param.requires_grad)
