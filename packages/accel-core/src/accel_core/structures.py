"""Helpers on nested structures of tensors (lists, tuples, namedtuples, dicts) that do not communicate.

The collectives are in ``accel_core.ops``; these inspect, describe or convert structures locally,
under the reference's names.

Example::

    info = get_data_structure({"x": torch.ones(2, 3)})   # {"x": TensorInformation(shape=(2, 3), dtype=float32)}
    empty = initialize_tensors(info)                      # tensors of those shapes, to receive a broadcast
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .ops import convert_to_fp32, find_batch_size, recursively_apply


@dataclass
class TensorInformation:
    """The shape and dtype of a tensor, to allocate its twin elsewhere."""

    shape: torch.Size
    dtype: torch.dtype


def is_tensor_information(tensor_info: Any) -> bool:
    """Whether ``tensor_info`` is a ``TensorInformation`` (shape and dtype of a tensor to receive)."""
    return isinstance(tensor_info, TensorInformation)


def get_data_structure(data: Any) -> Any:
    """``data`` with a ``TensorInformation`` in place of each tensor."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def get_shape(data: Any) -> Any:
    """``data`` with each tensor replaced by its shape as a list."""
    return recursively_apply(lambda t: list(t.shape), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Empty tensors in place of each ``TensorInformation`` of ``data_structure`` (the inverse of
    ``get_data_structure``)."""
    return recursively_apply(
        lambda i: torch.empty(*i.shape, dtype=i.dtype), data_structure, test_type=is_tensor_information
    )


def listify(data: Any) -> Any:
    """``data`` with each tensor turned into (nested) Python lists of numbers; bf16 goes through fp32."""

    def _to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).tolist()

    return recursively_apply(_to_list, data)


def ignorant_find_batch_size(data: Any) -> int | None:
    """The batch size of ``data`` (``find_batch_size``), or None when it has no tensor."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in ``data`` (None when there is none)."""
    if isinstance(data, torch.Tensor):
        return data.device
    values = data.values() if isinstance(data, Mapping) else data if isinstance(data, (tuple, list)) else ()
    for value in values:
        device = find_device(value)
        if device is not None:
            return device
    return None


class ConvertOutputsToFp32:
    """A forward function whose fp16 / bf16 outputs come back in fp32. Refuses to be pickled (unwrap the model
    first)."""

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "Cannot pickle a prepared model with automatic mixed precision: unwrap it first with "
            "`accelerator.unwrap_model(model)`."
        )


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps ``model_forward`` so that its outputs are converted to fp32 (``__wrapped__`` gives the original back)."""
    converted = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return converted(*args, **kwargs)

    forward.__wrapped__ = converted  # pyright: ignore[reportFunctionMemberAccess]  # what unwrap_forward reads
    return forward
