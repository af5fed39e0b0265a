"""Operations on collated batches seen as trees (tensors, lists, tuples, namedtuples, dicts).

The sharding of iterable datasets and the dispatcher work on batches that the user's DataLoader
already collated, so they need to measure, cut, join and move them whatever their nesting. The
leaves along the batch dimension are tensors, numpy arrays and lists (a default-collated column of
strings or ints is a list). Anything else is a scalar of the whole batch (kept as is when cut).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch


class BatchTypeError(TypeError):
    """A batch cannot be measured or cut along its first dimension."""


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _rebuild(obj: Any, values: Sequence[Any]) -> Any:
    if _is_namedtuple(obj):
        return type(obj)(*values)
    return type(obj)(values)


def _rebuild_mapping(obj: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    factory = cast("Callable[[dict[Any, Any]], Any]", type(obj))  # Mapping declares no constructor arguments
    try:
        return factory(items)
    except TypeError:  # a Mapping whose constructor wants something else (e.g. BatchEncoding-like)
        return items


def batch_size(batch: Any) -> int | None:
    """Length along the batch dimension of the first measurable leaf, ``None`` when there is none.

    A list of scalars counts as a batch of that many items (default collate of strings), while a
    list/tuple of tensors is a structure (e.g. ``(inputs, labels)``) measured through its first leaf.
    """
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() > 0 else None
    if hasattr(batch, "__array__") and hasattr(batch, "shape"):
        return batch.shape[0] if len(batch.shape) > 0 else None
    if isinstance(batch, Mapping):
        for value in batch.values():
            size = batch_size(value)
            if size is not None:
                return size
        return None
    if isinstance(batch, (list, tuple)):
        if _is_structure(batch):
            for value in batch:
                size = batch_size(value)
                if size is not None:
                    return size
            return None
        return len(batch)
    return None


def _is_structure(seq: Sequence[Any]) -> bool:
    """Whether a list/tuple is a structure of batched fields rather than a column of per-sample items.

    default_collate turns ``(x, y)`` samples into a tuple of batched tensors and list samples into
    a list of batched tensors; a list of strings, ints, lists or dicts is one item per sample.
    """
    if _is_namedtuple(seq):
        return True
    if isinstance(seq, tuple):
        return any(isinstance(v, (torch.Tensor, Mapping, list, tuple)) or hasattr(v, "__array__") for v in seq)
    return any(isinstance(v, torch.Tensor) or hasattr(v, "__array__") for v in seq)


def slice_batch(batch: Any, start: int, end: int) -> Any:
    """Items ``start:end`` of every leaf along the batch dimension."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            return batch
        return batch[start:end]
    if hasattr(batch, "__array__") and hasattr(batch, "shape"):
        return batch[start:end] if len(batch.shape) > 0 else batch
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {k: slice_batch(v, start, end) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        if _is_structure(batch):
            return _rebuild(batch, [slice_batch(v, start, end) for v in batch])
        return _rebuild(batch, list(batch[start:end])) if not isinstance(batch, list) else batch[start:end]
    if isinstance(batch, (str, bytes, int, float, bool)) or batch is None:
        return batch
    raise BatchTypeError(
        f"accel-data cannot cut a batch of type {type(batch).__name__} between processes. Return "
        "tensors, lists, tuples or dicts from your collate_fn, or use split_batches=False and even_batches=False."
    )


def concat_batches(batches: Sequence[Any]) -> Any:
    """Joins batches of the same structure along the batch dimension."""
    first = batches[0]
    if len(batches) == 1:
        return first
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            return first
        return torch.cat(list(batches), dim=0)
    if hasattr(first, "__array__") and hasattr(first, "shape"):
        import numpy as np

        return np.concatenate(list(batches), axis=0) if len(first.shape) > 0 else first
    if isinstance(first, Mapping):
        return _rebuild_mapping(first, {k: concat_batches([b[k] for b in batches]) for k in first})
    if isinstance(first, (list, tuple)):
        if _is_structure(first):
            return _rebuild(first, [concat_batches([b[i] for b in batches]) for i in range(len(first))])
        joined: list[Any] = []
        for b in batches:
            joined.extend(b)
        return joined if isinstance(first, list) else _rebuild(first, joined)
    if isinstance(first, (str, bytes, int, float, bool)) or first is None:
        return first
    raise BatchTypeError(
        f"accel-data cannot join batches of type {type(first).__name__} (needed to pad the last batch with "
        "even_batches=True). Return tensors, lists, tuples or dicts from your collate_fn, or set even_batches=False."
    )


def apply_to_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """``fn`` on every tensor of a tree; other leaves unchanged (objects with ``.to`` are moved too)."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return _rebuild_mapping(data, {k: apply_to_tensors(fn, v) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return _rebuild(data, [apply_to_tensors(fn, v) for v in data])
    return data


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


def to_device(data: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Moves every tensor of a batch (and objects with a ``.to(device)`` like BatchEncoding) to ``device``.

    Runs once per batch, so the common containers are matched by exact type first and a CPU
    tensor bound for the CPU is returned as is (``.to`` would return it too, only slower).
    """
    to_cpu = device.type == "cpu"

    def move(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x if to_cpu and x.is_cpu else x.to(device, non_blocking=non_blocking)
        cls = type(x)
        if cls is list:
            if all(type(v) in _SCALARS for v in x):  # a column of strings or numbers
                return x
            return [move(v) for v in x]
        if cls is tuple:
            return tuple([move(v) for v in x])
        if cls is dict:
            return {k: move(v) for k, v in x.items()}
        if cls in _SCALARS:
            return x
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return cls(*[move(v) for v in x])
        to = getattr(x, "to", None)  # BatchEncoding and other batch objects that move themselves
        if callable(to) and not isinstance(x, type):
            try:
                return to(device, non_blocking=non_blocking)
            except TypeError:
                return to(device)
        if isinstance(x, Mapping):
            return _rebuild_mapping(x, {k: move(v) for k, v in x.items()})
        if isinstance(x, (list, tuple)):
            return _rebuild(x, [move(v) for v in x])
        return x

    return move(data)
