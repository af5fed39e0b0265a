"""``save`` / ``load``: ``torch.save`` / ``torch.load`` replacements for scripts, once per job and safe by default.

Example::

    from accel.utils import save, load

    save(model.state_dict(), "weights.safetensors", safe_serialization=True)   # main process only
    state_dict = load("weights.pt")                                             # weights_only=True
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict, defaultdict
from typing import IO, Any, cast

import torch

from .numpy_data import numpy_arrays_allowed


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, storage address, storage bytes)``: equal for tensors sharing one storage (tied weights).

    Meta tensors have no storage: all of them answer address 0.
    """
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Keeps one name per shared storage (safetensors refuses aliases; warns about the names dropped) and makes tensors
    contiguous.

    The first name (in the state dict's order) of each storage stays; ``state_dict`` is modified.
    """
    names_by_storage: defaultdict[Any, list[str]] = defaultdict(list)
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor):
            names_by_storage[id_tensor_storage(tensor)].append(name)
    dropped = [name for names in names_by_storage.values() for name in names[1:]]
    for name in dropped:
        del state_dict[name]
    if dropped:
        warnings.warn(
            f"Removed shared tensor {set(dropped)} while saving. This should be OK, but check by verifying that you "
            "don't receive any warning while reloading.",
            stacklevel=3,
        )
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def save(
    obj: Any, f: str | os.PathLike[str] | IO[bytes], save_on_each_node: bool = False, safe_serialization: bool = False
) -> None:
    """Writes ``obj`` on the main process only (the first process of each machine with ``save_on_each_node``).

    safe_serialization: write a safetensors file (``obj`` must be a dict of tensors; shared tensors
    are written once) instead of ``torch.save``'s pickle. Every process may call it; the others do
    nothing, so no file is written twice.
    """
    from accel_core.state import PartialState

    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if not safe_serialization:
        torch.save(obj, f)
        return
    from safetensors.torch import save_file

    if isinstance(obj, OrderedDict):  # a state_dict(): tied weights share storage
        obj = clean_state_dict_for_safetensors(obj)
    save_file(obj, os.fspath(cast("str | os.PathLike[str]", f)), metadata={"format": "pt"})  # a path, not a stream


def load(f: str | os.PathLike[str] | IO[bytes], map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` with ``weights_only=True`` unless told otherwise, numpy arrays allowed.

    A file that needs code to unpickle raises torch's error; pass ``weights_only=False`` only for a
    file you trust.
    """
    kwargs.setdefault("weights_only", True)
    if not kwargs["weights_only"]:
        return torch.load(f, map_location=map_location, **kwargs)
    with numpy_arrays_allowed():
        return torch.load(f, map_location=map_location, **kwargs)
