"""Context parallelism over the mesh's ``cp`` dimension: torch's ``context_parallel``.

Inside ``accelerator.maybe_context_parallel(buffers=...)`` each process of a ``cp`` group holds
``1/cp`` of every sequence (torch splits the buffers in place, load-balanced: chunk ``i`` and
``2cp-1-i``), and ``torch.nn.functional.scaled_dot_product_attention`` is replaced by ring
attention over the group. Needs a GPU: torch registers sharding rules only for its CUDA attention
kernels (on the CPU, ``_scaled_dot_product_flash_attention_for_cpu`` has no sharding strategy), so
the attention call itself fails on CPU; the splitting of the batch does not.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

_SDPA = "scaled_dot_product_attention"


def uses_sdpa(model: nn.Module) -> bool:
    """Whether some module of ``model`` calls ``scaled_dot_product_attention`` in its code (the only
    attention ``context_parallel`` shards), or declares so (``config._attn_implementation == "sdpa"``)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa":
        return True
    seen: set[type] = set()
    for module in model.modules():
        cls = type(module)
        if cls in seen or cls.__module__.startswith("torch."):
            continue
        seen.add(cls)
        try:
            if _SDPA in inspect.getsource(cls):
                return True
        except (OSError, TypeError):  # no source (compiled, interactive): cannot tell, so trust it
            return True
    return False


def check_model(model: nn.Module, cp_size: int) -> None:
    """Refuses a model whose attention context parallelism would not shard (every process alike, before any
    communication)."""
    if not uses_sdpa(model):
        raise ValueError(
            f"cp_size={cp_size} splits each sequence over {cp_size} processes, but {type(model).__name__} never calls "
            "torch.nn.functional.scaled_dot_product_attention, the only attention torch's context_parallel shards: its "
            "attention would see only this process's chunk. Use F.scaled_dot_product_attention (or an sdpa attention "
            "implementation), or set cp_size=1."
        )


@contextlib.contextmanager
def context_parallel_block(
    cp_mesh: DeviceMesh,
    buffers: list[torch.Tensor] | None,
    buffer_seq_dims: list[int] | None,
    no_restore_buffers: set[torch.Tensor] | None,
    comm_strategy: str,
) -> Iterator[None]:
    """Shards ``buffers`` along their sequence dims over ``cp_mesh`` and runs SDPA as ring attention inside."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    buffers = list(buffers or [])
    dims = list(buffer_seq_dims or [])
    if len(dims) != len(buffers):
        raise ValueError(
            f"maybe_context_parallel: {len(buffers)} buffers but {len(dims)} buffer_seq_dims; give one dim per buffer."
        )
    for tensor, dim in zip(buffers, dims, strict=True):
        if tensor.shape[dim] % (2 * cp_mesh.size()):
            raise ValueError(
                f"maybe_context_parallel: a sequence of length {tensor.shape[dim]} (dim {dim}) must divide by "
                f"2 x cp_size = {2 * cp_mesh.size()} (torch balances the load with 2 chunks per process): pad it."
            )
    set_rotate_method(comm_strategy)
    with context_parallel(cp_mesh, buffers=buffers, buffer_seq_dims=dims, no_restore_buffers=no_restore_buffers):
        yield
