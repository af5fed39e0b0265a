"""Full weights of a tensor-parallel model: gathered from the TP shards, and split back into them.

Megatron marks each TP-sharded parameter with ``tensor_model_parallel=True``, the dimension it is
split along (``partition_dim``) and ``partition_stride``; a shard is the ``tp_rank``-th contiguous
block along that dimension when the stride is 1 (every ``tensor_parallel`` layer's default). Other
parameters and buffers are replicated over the TP group and taken as they are.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch import nn

from .groups import tensor_parallel_group


def is_tp_sharded(param: torch.Tensor) -> bool:
    return bool(getattr(param, "tensor_model_parallel", False))


def _partition_dim(param: nn.Parameter) -> int:
    """The dimension along which megatron's tensor-parallel layers split ``param`` (an attribute they set on it)."""
    return param.partition_dim  # pyright: ignore[reportAttributeAccessIssue]  # set by megatron.core.tensor_parallel


def _sharded_params_by_key(module: nn.Module) -> dict[str, nn.Parameter]:
    """State-dict key -> TP-sharded parameter, tied names included."""
    found = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if is_tp_sharded(param):
            stride = getattr(param, "partition_stride", 1)
            if stride != 1:
                raise ValueError(
                    f"{name} is split over the TP group with partition_stride={stride}; only stride 1 (the default of "
                    "megatron.core.tensor_parallel layers) can be gathered into a full weight here."
                )
            found[name] = param
    return found


def _without_empty_extra_state(state: dict[str, Any]) -> dict[str, Any]:
    # Megatron's TP layers add `<layer>._extra_state = None` (kept for Transformer-Engine checkpoints).
    return {k: v for k, v in state.items() if not (k.endswith("_extra_state") and v is None)}


def full_state_dict(module: nn.Module) -> dict[str, Any]:
    """The whole model's weights, TP shards concatenated along their ``partition_dim``, on every process. Collective
    over TP."""
    state = _without_empty_extra_state(module.state_dict())
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    if tp_size == 1:
        return state
    group = tensor_parallel_group()
    for key, param in _sharded_params_by_key(module).items():
        if key not in state:
            continue
        local = state[key].contiguous()
        parts = [torch.empty_like(local) for _ in range(tp_size)]
        dist.all_gather(parts, local, group=group)
        state[key] = torch.cat(parts, dim=_partition_dim(param))
    return state


def load_full_state_dict(module: nn.Module, state_dict: dict[str, Any], strict: bool = True) -> Any:
    """Loads full weights (the same on every process); each TP rank keeps its own block. No communication."""
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    local_state = dict(state_dict)
    for key, param in _sharded_params_by_key(module).items():
        if key not in local_state:
            continue
        full = local_state[key]
        dim = _partition_dim(param)
        expected = list(param.shape)
        expected[dim] *= tp_size
        if list(full.shape) != expected:
            raise ValueError(
                f"{key}: the full weight has shape {tuple(full.shape)}, but this TP shard {tuple(param.shape)} over "
                f"tp_degree={tp_size} needs {tuple(expected)}. Load weights of the same model."
            )
        local_state[key] = full.narrow(dim, tp_rank * param.shape[dim], param.shape[dim])
    return module.load_state_dict(local_state, strict=strict)
