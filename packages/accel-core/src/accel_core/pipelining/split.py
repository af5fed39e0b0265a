"""Splitting one model into pipeline stages, keeping the user's parameter names (torchtitan's manual split).

A model is seen as a *chain of units*: its top-level children in registration order, with a
block container (``nn.ModuleList`` / ``nn.Sequential`` / ``nn.ModuleDict`` child, or the model
itself when it is an ``nn.Sequential`` / ``nn.ModuleList``) opened into its blocks::

    embed, layers.0, layers.1, layers.2, layers.3, norm, head

A stage is a contiguous run of units. Its module is the model itself with every other unit taken
out: a block is removed from its container (the others keep their names: ``layers.2`` stays
``layers.2``, and iterating the container yields the kept blocks), any other unit becomes
``nn.Identity``. So the model's own ``forward`` runs the stage, provided it calls its units as a
chain (what one unit returns is what the next takes; a removed unit passes its input on). Stage
parameters keep their names, so optimizers, state dicts and checkpoints line up with the whole
model's.

Where stages begin: ``ParallelismConfig.pp_split_points`` (unit names, like
``SplitPoint.BEGINNING``), else the blocks split evenly (units before the blocks go to the first
stage, units after them to the last). A ``model_parts`` list the user builds is an
``nn.Sequential(*parts)`` with one part per stage.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from itertools import pairwise

import torch.distributed as dist
from torch import nn

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def chain_units(model: nn.Module) -> list[str]:
    """The unit names of ``model`` in chain order (see the module docstring)."""
    if isinstance(model, (nn.Sequential, nn.ModuleList)):
        return [name for name, _ in model.named_children()]
    units: list[str] = []
    for name, child in model.named_children():
        if isinstance(child, _CONTAINERS) and len(child) > 0:
            units.extend(f"{name}.{block}" for block, _ in child.named_children())
        else:
            units.append(name)
    return units


def _block_span(model: nn.Module, units: list[str]) -> tuple[int, int]:
    """Positions ``[start, stop)`` of the largest block container's units (the whole chain for a Sequential)."""
    if isinstance(model, (nn.Sequential, nn.ModuleList)):
        return 0, len(units)
    best: tuple[int, int] = (0, len(units))
    best_size = 0
    for name, child in model.named_children():
        if isinstance(child, _CONTAINERS) and len(child) > best_size:
            start = units.index(f"{name}.{next(iter(child._modules))}")
            best, best_size = (start, start + len(child)), len(child)
    return best


def stage_boundaries(model: nn.Module, num_stages: int, split_points: Sequence[str] | None = None) -> list[list[str]]:
    """The unit names of each of ``num_stages`` stages. Raises ValueError naming the fix when they cannot be formed."""
    units = chain_units(model)
    if split_points is not None:
        points = list(split_points)
        if len(points) != num_stages - 1:
            raise ValueError(
                f"pp_split_points names {len(points)} point(s), but {num_stages} stages need {num_stages - 1} (where "
                f"stages 1..{num_stages - 1} begin). Units of {type(model).__name__}: {units}."
            )
        unknown = [p for p in points if p not in units]
        if unknown:
            raise ValueError(
                f"pp_split_points {unknown} are not units of {type(model).__name__}'s chain; name one of {units}."
            )
        starts = [0] + [units.index(p) for p in points] + [len(units)]
        if any(a >= b for a, b in pairwise(starts)):
            raise ValueError(f"pp_split_points {points} must be in chain order with each stage non-empty: {units}.")
        return [units[a:b] for a, b in pairwise(starts)]
    start, stop = _block_span(model, units)
    blocks = stop - start
    if blocks < num_stages:
        raise ValueError(
            f"{type(model).__name__} has {blocks} block(s) to spread over {num_stages} pipeline stages: use fewer "
            "stages (pp_size x pp_stages_per_rank), or name the stage starts with pp_split_points."
        )
    sizes = [blocks // num_stages + (1 if i < blocks % num_stages else 0) for i in range(num_stages)]
    stages, position = [], start
    for size in sizes:
        stages.append(units[position : position + size])
        position += size
    stages[0] = units[:start] + stages[0]
    stages[-1] = stages[-1] + units[stop:]
    return stages


def _check_shared(model: nn.Module, stages: list[list[str]]) -> None:
    """Refuses parameters a stage cannot own alone: on the root itself, or tied between units of different stages."""
    own = [name for name, _ in model.named_parameters(recurse=False)]
    if own:
        raise ValueError(
            f"{type(model).__name__} holds parameters {own} directly, outside its chain of units, so no pipeline stage "
            "owns them: move them into a submodule of the chain (the embedding module, say)."
        )
    owner: dict[int, tuple[int, str]] = {}
    for index, names in enumerate(stages):
        for unit in names:
            for pname, param in model.get_submodule(unit).named_parameters():
                seen = owner.setdefault(id(param), (index, f"{unit}.{pname}"))
                if seen[0] != index:
                    raise ValueError(
                        f"{seen[1]} (stage {seen[0]}) and {unit}.{pname} (stage {index}) are the same tensor: tied "
                        "weights cannot span pipeline stages. Untie them, or put both units in one stage "
                        "(pp_split_points)."
                    )


def prune_to_stage(model: nn.Module, keep: Sequence[str]) -> nn.Module:
    """Takes out of ``model`` (in place) every unit not in ``keep``; returns ``model``."""
    kept = set(keep)
    for unit in chain_units(model):
        if unit in kept:
            continue
        parent_name, _, child = unit.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if parent is model and not isinstance(model, (nn.Sequential, nn.ModuleList)):
            setattr(model, child, nn.Identity())
        else:
            # Removing the entry keeps the other blocks' names; containers iterate their remaining entries.
            del parent._modules[child]
    return model


def split_model(
    model: nn.Module, num_stages: int, local_stages: Sequence[int], split_points: Sequence[str] | None = None
) -> list[nn.Module]:
    """One module per stage in ``local_stages``, each ``model`` pruned to that stage; the other stages' tensors are
    not referenced by them. Several local stages share no tensors; one local stage is ``model`` itself, pruned.

    Example::

        (stage,) = split_model(model, num_stages=2, local_stages=[rank])   # rank 0: embed + first half
    """
    stages = stage_boundaries(model, num_stages, split_points)
    _check_shared(model, stages)
    parts = []
    for position, index in enumerate(local_stages):
        if position == len(local_stages) - 1:
            part = model
        else:
            # A structural copy whose tensors are the model's own (not copies): pruning it drops only references.
            # Process groups a layer keeps (Megatron's tensor-parallel layers) are shared too: they cannot be copied.
            memo: dict[int, object] = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
            memo.update(
                (id(value), value)
                for module in model.modules()
                for value in vars(module).values()
                if isinstance(value, dist.ProcessGroup)
            )
            part = copy.deepcopy(model, memo)
        parts.append(prune_to_stage(part, stages[index]))
    return parts


def parameter_bytes(modules: Sequence[nn.Module]) -> int:
    """Bytes of the distinct parameters of ``modules`` (local pieces of DTensors; meta tensors count as 0)."""
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    total = 0
    for module in modules:
        for param in module.parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            local = param.to_local() if isinstance(param, DTensor) else param
            if not local.is_meta:
                total += local.numel() * local.element_size()
    return total


__all__ = ["chain_units", "parameter_bytes", "prune_to_stage", "split_model", "stage_boundaries"]
