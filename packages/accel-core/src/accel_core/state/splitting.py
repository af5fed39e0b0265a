"""How ``split_between_processes`` cuts an input into per-process shares (lists, tensors, dicts of them, tables)."""

from __future__ import annotations

from typing import Any

import torch


def split_inputs(inputs: Any, n: int, index: int, apply_padding: bool) -> Any:
    if n == 1:
        return inputs
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("split_between_processes: all values of the dict must have the same length.")
        return {k: split_inputs(v, n, index, apply_padding) for k, v in inputs.items()}
    length = inputs.shape[0] if isinstance(inputs, torch.Tensor) else len(inputs)
    base, extra = divmod(length, n)
    start = index * base + min(index, extra)
    end = start + base + (1 if index < extra else 0)
    wanted = base + (1 if extra else 0)
    select = getattr(inputs, "select", None)
    if callable(select) and not isinstance(inputs, (torch.Tensor, list, tuple, str)):
        # A table with its own row selection (a Hugging Face ``datasets.Dataset``): slicing it
        # gives a dict of columns, so its rows are picked with ``select``.
        rows = list(range(start, end))
        if apply_padding and length > 0:
            rows += [length - 1] * (wanted - len(rows))
        return select(rows)
    share = inputs[start:end]
    if apply_padding and len(share) < wanted and length > 0:
        # Short shares repeat the last item of the input (as Accelerate pads).
        last = inputs[length - 1 : length]
        missing = wanted - len(share)
        if isinstance(share, torch.Tensor) and isinstance(last, torch.Tensor):
            share = torch.cat([share] + [last] * missing)
        else:
            share = type(share)(list(share) + list(last) * missing)
    return share
