"""The always-on agreement check that runs before a collective moves data.

A collective whose inputs differ across ranks does not fail cleanly in torch: ``all_gather`` of
different sizes returns a wrong-length result on one rank while gloo aborts the other, a dtype
mismatch returns reinterpreted bits, ``broadcast`` into a differently shaped tensor fills part of
it. So before ``gather`` / ``gather_for_metrics`` / ``broadcast`` / ``reduce`` /
``pad_across_processes`` move data, every rank describes its input (the nested structure, each
tensor's dtype and shape, or only the number of dimensions where the operation allows sizes to
differ) and all ranks exchange an 8-byte digest of that description in one ``all_gather`` of a
single int64. Equal digests: the data moves. Any difference: every rank sees it at the same time,
exchanges the readable descriptions (``all_gather_object``, only on this failure path) and raises
the same ``DistributedOperationException`` naming each rank's shapes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from .state import PartialState


class DistributedOperationException(ValueError, RuntimeError):
    """Raised on every rank when the inputs of a collective do not match across processes.

    A ``ValueError`` (bad input) and, as before, a ``RuntimeError``.
    """


def _contains_tensor(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, Mapping):
        return any(_contains_tensor(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return any(_contains_tensor(v) for v in data)
    return False


def describe(data: Any, ndim_only: bool = False, path: str = "") -> list[str]:
    """One line per leaf of ``data``: its path, then ``dtype shape`` for a tensor, or the object's type.

    A list or tuple holding no tensor is one object leaf (``gather_for_metrics`` gathers it as an
    object). ``ndim_only`` keeps only the number of dimensions (``pad_across_processes``).
    """
    if isinstance(data, torch.Tensor):
        if ndim_only:
            return [f"{path or 'tensor'}: {data.ndim}-d"]
        shape = tuple(data.shape)
        return [f"{path or 'tensor'}: {str(data.dtype).removeprefix('torch.')} {shape}"]
    if isinstance(data, Mapping):
        lines = [f"{path or 'input'}: {type(data).__name__} of {len(data)}"]
        for key, value in data.items():
            lines.extend(describe(value, ndim_only, f"{path}[{key!r}]"))
        return lines
    if isinstance(data, (list, tuple)) and _contains_tensor(data):
        lines = [f"{path or 'input'}: {type(data).__name__} of {len(data)}"]
        for index, value in enumerate(data):
            lines.extend(describe(value, ndim_only, f"{path}[{index}]"))
        return lines
    return [f"{path or 'input'}: {type(data).__name__} (not a tensor)"]


def _digest(lines: list[str]) -> int:
    # A stable hash (Python's hash() of a str differs between processes), as a signed int64.
    raw = hashlib.blake2b("\n".join(lines).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def check_agreement(operation: str, data: Any, group: Any = None, ndim_only: bool = False, hint: str = "") -> None:
    """Raises ``DistributedOperationException`` on every rank of ``group`` unless all pass alike inputs.

    One ``all_gather`` of one int64 per rank when they agree. ``ndim_only``: compare the structure,
    dtypes aside, and the number of dimensions only (the sizes may differ).
    hint: what to do about it, appended to the message.
    """
    state = PartialState()
    lines = describe(data, ndim_only=ndim_only)
    device = state.device if state.backend is not None and "nccl" in str(state.backend) else torch.device("cpu")
    mine = torch.tensor([_digest(lines)], dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    digests = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(digests, mine, group=group)
    values = [int(d.item()) for d in digests]
    if all(v == values[0] for v in values):
        return
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, lines, group=group)
    described = "\n".join(f"  - process {i}: " + "; ".join(d) for i, d in enumerate(everyone))
    what = "structures or numbers of dimensions" if ndim_only else "structures, dtypes or shapes"
    raise DistributedOperationException(
        f"Cannot apply {operation}: the inputs have different {what} across processes (nothing was exchanged):\n"
        f"{described}\n{hint}".rstrip()
    )
