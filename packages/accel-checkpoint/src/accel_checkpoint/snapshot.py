"""Copying state to CPU memory, the only part of an async save that blocks training.

A synchronous save writes CPU tensors straight from their memory (no copy at all). An async save
must copy, because training keeps changing parameters and optimizer moments in place while the
background thread writes. The copies go into buffers kept between saves (pinned memory for CUDA
tensors, so device-to-host copies run at full speed), so the second and later async saves allocate
nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

CopyFn = Callable[[str, torch.Tensor], torch.Tensor]


def to_cpu_without_copy(_key: str, tensor: torch.Tensor) -> torch.Tensor:
    """For synchronous saves: CPU tensors are used as they are, device tensors are brought over."""
    tensor = tensor.detach()
    return tensor if tensor.device.type == "cpu" else tensor.to("cpu")


class HostBuffers:
    """Reusable CPU buffers, one per (file, key path); the async writer must be joined before reuse."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._device_copies = False
        self._stager: Any = None

    def stage_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A CPU copy of a ``torch.distributed.checkpoint`` state dict (DTensor and ShardedTensor shards included),
        made by torch's own stager, whose buffers are kept for the next save as ours are."""
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            pin = torch.cuda.is_available()
            options = StagingOptions(
                use_pinned_memory=pin, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
            )
            self._stager = DefaultStager(options)
        return self._stager.stage(state_dict)

    def copy(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = tensor.device.type == "cuda"
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buffer
        on_device = tensor.device.type != "cpu"
        buffer.copy_(tensor, non_blocking=on_device)
        self._device_copies |= on_device
        return buffer

    def synchronize(self) -> None:
        """Waits for the non-blocking device-to-host copies issued since the last call."""
        if self._device_copies and torch.cuda.is_available():
            torch.cuda.synchronize()
        self._device_copies = False

    def clear(self) -> None:
        self._buffers.clear()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def copy_tree(obj: Any, copy_tensor: CopyFn, key: str = "") -> Any:
    """``obj`` with every tensor replaced by ``copy_tensor(key_path, tensor)`` and containers rebuilt.

    One tensor object reached twice is copied once and stays shared in the copy, as ``torch.save``
    would have kept it. Other values are deep-copied so later changes by training do not leak in.
    """
    memo: dict[int, Any] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in memo:
                memo[id(value)] = copy_tensor(path, value)
            return memo[id(value)]
        if isinstance(value, dict):
            try:
                out = {} if type(value) is dict else type(value)()
            except TypeError:  # e.g. defaultdict: the factory does not matter for saved state
                out = {}
            for k, v in value.items():
                out[k] = walk(v, f"{path}/{k}")
            return out
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(walk(v, f"{path}/{i}") for i, v in enumerate(value))
        if isinstance(value, (int, float, str, bool, bytes, type(None), torch.dtype, torch.device)):
            return value
        return copy.deepcopy(value)

    return walk(obj, key)
