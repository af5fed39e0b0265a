"""Collective operations on nested structures of tensors (lists, tuples, namedtuples, dicts).

Every function works on one process too (then it returns its input, or a copy where the
multi-process version would return new tensors). Before moving data, ``gather``, ``broadcast``,
``reduce`` and ``pad_across_processes`` compare the structure, dtypes and shapes of all ranks (one
small all_gather, which also carries the small tensors of a gather; see
``accel_core.collective_check``) and raise
``DistributedOperationException`` on every rank when they differ — instead of the hang, the abort
or the silent garbage a mismatch otherwise gives.

Example::

    predictions = accelerator.pad_across_processes(predictions, dim=1)
    all_predictions = gather(predictions)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
import torch.distributed as dist

from .collective_check import DistributedOperationException, check_agreement, checked_small_gather, unpack
from .stall_report import watched
from .state import PartialState

__all__ = ["DistributedOperationException"]  # re-exported: its home is collective_check


def is_torch_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.Tensor``."""
    return isinstance(obj, torch.Tensor)


def is_namedtuple(obj: Any) -> bool:
    """Whether ``obj`` is a ``collections.namedtuple`` instance."""
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """Builds a container of ``obj``'s type (namedtuples included) from ``generator``."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def mapping_like(mapping: Mapping[Any, Any], items: dict[Any, Any]) -> Any:
    """A mapping of ``mapping``'s own type (dict, OrderedDict, BatchEncoding, ...) holding ``items``."""
    # Mapping itself declares no constructor arguments; the concrete types take the items.
    factory = cast("Callable[[dict[Any, Any]], Any]", type(mapping))
    return factory(items)


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Applies ``func`` to every leaf of ``data`` that passes ``test_type``, keeping the structure.

    Leaves that fail ``test_type`` are returned as they are, or raise ``TypeError`` when
    ``error_on_other_type`` is set.
    """
    if isinstance(data, (tuple, list)):
        return honor_type(
            data,
            (
                recursively_apply(
                    func, o, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for o in data
            ),
        )
    if isinstance(data, Mapping):
        return mapping_like(
            data,
            {
                k: recursively_apply(
                    func, v, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs
                )
                for k, v in data.items()
            },
        )
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(
            f"Unsupported type {type(data).__name__} passed to {getattr(func, '__name__', func)}: only nested "
            "lists, tuples and dicts of torch.Tensor are supported. Use gather_object for other Python objects."
        )
    return data


def _leaves(data: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    recursively_apply(found.append, data)
    return found


def send_to_device(
    tensor: Any, device: torch.device | str | int, non_blocking: bool = False, skip_keys: Any = None
) -> Any:
    """Moves every tensor (and every object with a ``.to`` method) in ``tensor``, a nested structure, to ``device``.

    ``skip_keys``: dict keys whose values stay where they are.
    """
    data = tensor
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    skip = set(skip_keys or ())
    if isinstance(data, (tuple, list)):
        return honor_type(data, (send_to_device(o, device, non_blocking, skip_keys) for o in data))
    if isinstance(data, Mapping):
        return mapping_like(
            data, {k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys) for k, v in data.items()}
        )
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    to = getattr(data, "to", None)
    if callable(to):
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:
            return to(device)
    return data


# -- collectives --------------------------------------------------------------------------------
def _gather_one(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor[None]
    collectives = PartialState().collectives
    if collectives is not None:  # the backend's runtime has one group: all processes
        return collectives.all_gather(tensor)
    # Straight into the concatenated result: no per-rank tensors to allocate and concatenate after.
    out = tensor.new_empty((dist.get_world_size(group) * tensor.shape[0], *tensor.shape[1:]))
    dist.all_gather_into_tensor(out, tensor.contiguous(), group=group)
    return out


@watched("gather")
def gather(tensor: Any, group: Any = None) -> Any:
    """Gathers tensors from every process (of ``group``, default all) and concatenates them on the first dimension.

    All processes must pass the same shapes (pad first with ``pad_across_processes``). 0-d tensors
    become one element each.
    """
    if PartialState().collectives is not None:
        return recursively_apply(_gather_one, tensor, error_on_other_type=True)
    if not PartialState().use_distributed:
        return tensor
    return checked_gather("gather", tensor, group)


PAD_HINT = (
    "Every process must pass the same shapes: pad the differing dimension first with "
    "`accelerator.pad_across_processes(tensor, dim=...)`, and cast to one dtype."
)
"""What a shape mismatch before a gather tells the user to do."""


def checked_gather(operation: str, data: Any, group: Any = None, hint: str = PAD_HINT) -> Any:
    """``gather`` of nested tensors after the agreement check, which carries the small tensors' data.

    operation: the name the error names (``gather``, ``gather_for_metrics``).
    """
    leaves, gathered = checked_small_gather(operation, data, group, hint=hint)
    rest = [leaf for leaf, result in zip(leaves, gathered, strict=True) if result is None]
    if rest:  # too large to ride with the check: they move after it
        more = iter(gather_unchecked(rest, group))
        gathered = [result if result is not None else next(more) for result in gathered]
    if type(data) in (list, tuple) and len(gathered) == len(data) and all(is_torch_tensor(v) for v in data):
        return type(data)(gathered)  # (predictions, labels): no walk needed
    results = iter(gathered)
    return recursively_apply(lambda t: next(results), data, error_on_other_type=True)


_PACK_BYTES = 2**20


def gather_unchecked(tensor: Any, group: Any = None) -> Any:
    """``gather`` without the agreement check, for callers that ran ``check_agreement`` on a larger structure.

    Several small tensors on one device travel in one all_gather of their bytes (the check made
    their shapes equal on every rank, so each rank's buffer splits the same way): small gathers
    cost a collective's latency each, while packing large ones would only add copies.
    """
    if PartialState().collectives is not None:
        return recursively_apply(lambda t: _gather_one(t, group), tensor, error_on_other_type=True)
    leaves = _leaves(tensor)
    total = sum(t.numel() * t.element_size() for t in leaves)
    if len(leaves) < 2 or total > _PACK_BYTES or any(t.device != leaves[0].device for t in leaves):
        return recursively_apply(lambda t: _gather_one(t, group), tensor, error_on_other_type=True)
    parts = [(t[None] if t.ndim == 0 else t).contiguous() for t in leaves]
    packed = torch.cat([p.reshape(-1).view(torch.uint8) for p in parts])
    world = dist.get_world_size(group)
    everyone = _gather_one(packed, group).view(world, -1)
    gathered, offset = [], 0
    for part in parts:
        gathered.append(unpack(everyone, offset, part))
        offset += part.numel() * part.element_size()
    results = iter(gathered)
    return recursively_apply(lambda t: next(results), tensor, error_on_other_type=True)


@watched("gather_object")
def gather_object(object: Any, group: Any = None) -> Any:  # the reference's argument name
    """Gathers any picklable objects (from ``group``, default all processes); lists and tuples are
    concatenated, other objects listed per rank. On one process ``object`` comes back as it is."""
    obj = object
    state = PartialState()
    if state.collectives is not None:
        everyone = state.collectives.gather_object(obj)
        return [item for part in everyone for item in part] if isinstance(obj, (list, tuple)) else everyone
    if not state.use_distributed:
        return obj
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, obj, group=group)
    if isinstance(obj, (list, tuple)):
        return [item for part in everyone for item in part]
    return everyone


def any_process(flag: torch.Tensor) -> bool:
    """Whether ``flag`` (a 0-d tensor, > 0 meaning yes) is set on any process; every process gets the same answer.

    One all_reduce (MAX) of one number when several processes run: how ranks agree on skipping a step
    or stopping, so that no rank runs a collective the others skip.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


@watched("broadcast")
def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Copies the tensors of ``from_process`` into every process's tensors (same shapes needed)."""
    collectives = PartialState().collectives
    if collectives is not None:
        return recursively_apply(lambda t: collectives.broadcast(t, from_process), tensor, error_on_other_type=True)
    if not PartialState().use_distributed:
        return tensor
    check_agreement(
        "broadcast", tensor, hint="Every process must pass a tensor of the sender's shape and dtype to receive into."
    )

    def _broadcast_one(t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=from_process)
        return t

    return recursively_apply(_broadcast_one, tensor, error_on_other_type=True)


@watched("broadcast_object_list")
def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Replaces, in place, the items of ``object_list`` by those of ``from_process`` (any picklable objects)."""
    collectives = PartialState().collectives
    if collectives is not None:
        object_list[:] = collectives.broadcast_object(list(object_list), from_process)
    elif PartialState().use_distributed:
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


# reduction name -> torch's ReduceOp member; "mean" sums then divides.
_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


@watched("reduce")
def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Reduces tensors across processes; every process gets the result.

    reduction: ``"mean"`` (the default, as Accelerate's ``utils.reduce``), ``"sum"``, ``"max"``,
    ``"min"``, ``"product"``, or ``"none"`` (a copy, no communication). ``Accelerator.reduce``
    defaults to ``"sum"``, as Accelerate's does.
    scale: multiplies the result.

    Example::

        mean_loss = reduce(loss.detach())  # the same value on every process
    """
    if reduction not in _REDUCE_OPS and reduction != "none":
        raise ValueError(f"Unknown reduction {reduction!r}: use one of {', '.join([*_REDUCE_OPS, 'none'])}.")
    state = PartialState()

    def _reduce_one(t: torch.Tensor) -> torch.Tensor:
        if state.collectives is not None and reduction != "none":
            out = state.collectives.all_reduce(t, "sum" if reduction == "mean" else reduction)
            if reduction == "mean":
                out = out / state.num_processes
            return out * scale if scale != 1.0 else out
        out = t.clone()
        if state.use_distributed and reduction != "none":
            dist.all_reduce(out, op=getattr(dist.ReduceOp, _REDUCE_OPS[reduction]))
            if reduction == "mean":
                out = out / state.num_processes
        if scale != 1.0:
            out = out * scale
        return out

    if state.collectives is None and state.use_distributed and reduction != "none":
        check_agreement("reduce", tensor, hint="Every process must pass the same shapes and dtypes.")
    return recursively_apply(_reduce_one, tensor, error_on_other_type=True)


@watched("pad_across_processes")
def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pads tensors along ``dim`` to the largest size any process has, so they can be gathered.

    ``dim`` may be negative. In a nested structure, tensors without that dimension are left as
    they are; when no tensor has it (``dim=5`` on a 2-D tensor), ``ValueError`` on every process.
    """
    state = PartialState()
    if state.use_distributed and state.collectives is None:
        check_agreement(
            "pad_across_processes",
            tensor,
            ndim_only=True,
            hint="Only the size along `dim` may differ: pass tensors with the same number of dimensions on every "
            "process.",
        )
    # After the check every process has the same numbers of dimensions: this raises on all or none.
    every = _leaves(tensor)
    leaves = [t for t in every if t.ndim > 0 and -t.ndim <= dim < t.ndim]
    if every and not leaves:
        dims = sorted({t.ndim for t in every})
        raise ValueError(
            f"pad_across_processes(dim={dim}): the tensors have {' or '.join(map(str, dims))} dimension(s), so "
            f"there is no dimension {dim} to pad. Pass a dim between {-max(dims)} and {max(dims) - 1}."
            if max(dims) > 0
            else f"pad_across_processes(dim={dim}): the tensors are 0-d (scalars) and have no dimension to pad."
        )
    if not state.use_distributed or not leaves:
        return tensor
    # The sizes along ``dim`` of every leaf in one all_gather (the check made the leaf counts agree).
    sizes = torch.tensor([t.shape[dim % t.ndim] for t in leaves], dtype=torch.int64, device=leaves[0].device)
    longest_of = iter(_gather_one(sizes).view(-1, len(leaves)).max(dim=0).values.tolist())

    def _pad_one(t: torch.Tensor) -> torch.Tensor:
        if t.ndim == 0 or dim >= t.ndim or dim < -t.ndim:
            return t
        d = dim % t.ndim
        longest = int(next(longest_of))
        if longest == t.shape[d]:
            return t
        shape = list(t.shape)
        shape[d] = longest
        padded = t.new_full(shape, pad_index)
        index = [slice(None)] * t.ndim
        index[d] = slice(longest - t.shape[d], longest) if pad_first else slice(0, t.shape[d])
        padded[tuple(index)] = t
        return padded

    return recursively_apply(_pad_one, tensor, error_on_other_type=True)


def find_batch_size(data: Any) -> int | None:
    """The first dimension of the first tensor in ``data`` (None when there is none)."""
    leaves = _leaves(data)
    for leaf in leaves:
        if leaf.ndim > 0:
            return int(leaf.shape[0])
    return None


def slice_tensors(
    data: Any, tensor_slice: slice, process_index: int | None = None, num_processes: int | None = None
) -> Any:
    """Applies ``tensor_slice`` to every tensor in ``data``.

    ``process_index`` / ``num_processes`` are accepted for the reference's signature and not used.
    """
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenates a list of structures of tensors leaf by leaf."""
    first = data[0]
    if isinstance(first, (tuple, list)):
        return honor_type(first, (concatenate([d[i] for d in data], dim=dim) for i in range(len(first))))
    if isinstance(first, Mapping):
        return mapping_like(first, {k: concatenate([d[k] for d in data], dim=dim) for k in first})
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"Can only concatenate tensors, got {type(first).__name__}.")
    return torch.cat(data, dim=dim)


def convert_to_fp32(tensor: Any) -> Any:
    """Casts fp16 / bf16 tensors in ``tensor``, a nested structure, to fp32 (outputs of an autocast forward)."""
    return recursively_apply(
        lambda t: t.float(),
        tensor,
        test_type=lambda t: (
            (isinstance(t, torch.Tensor) or hasattr(t, "dtype")) and t.dtype in (torch.float16, torch.bfloat16)
        ),
    )
