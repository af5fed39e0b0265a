"""Tensor parallelism over the mesh's ``tp`` dimension with ``torch.distributed.tensor.parallel``.

How the model is split, first found wins: ``ParallelismConfig.parallelize_fn(model, tp_mesh)``,
``ParallelismConfig.tp_plan``, the model's own ``parallelize(tp_mesh)`` method, the model's own
``tp_plan`` attribute. A plan maps module-name patterns (``*`` matches one name part, as
``parallelize_module`` reads them) to a ``ParallelStyle`` or one of the names of ``STYLE_NAMES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any, cast

from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..parallel.config import ParallelismConfig
    from ..precision.modes import Precision

STYLE_NAMES = ("colwise", "rowwise", "colwise_rep", "sequence_parallel")


def make_style(value: Any, key: str) -> Any:
    """A ``ParallelStyle`` from a style object or its name."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        SequenceParallel,
    )

    if isinstance(value, ParallelStyle):
        return value
    styles = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "sequence_parallel": SequenceParallel,
    }
    if isinstance(value, str) and value.lower() in styles:
        return styles[value.lower()]()
    raise ValueError(
        f"tp_plan[{key!r}] = {value!r}: use a torch ParallelStyle (ColwiseParallel(), RowwiseParallel(), "
        f"SequenceParallel(), ...) or one of the names {', '.join(STYLE_NAMES)}."
    )


def matching_modules(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    """The submodules whose name matches ``pattern`` part by part (``parallelize_module``'s rule)."""
    tokens = pattern.split(".")
    found = []
    for name, module in model.named_modules():
        parts = name.split(".") if name else []
        if len(parts) == len(tokens) and all(fnmatch(p, t) for p, t in zip(parts, tokens, strict=True)):
            found.append((name, module))
    return found


def plan_targets(model: nn.Module, key: str) -> list[tuple[str, nn.Module]]:
    """The submodules a ``tp_plan`` key names; a key that matches none is an error naming what names look like."""
    matches = matching_modules(model, key)
    if not matches:
        raise ValueError(
            f"tp_plan key {key!r} matches no submodule of {type(model).__name__}; names look like "
            f"{[n for n, _ in model.named_modules() if n][:6]} (use * for one name part, e.g. 'layers.*.mlp.up')."
        )
    return matches


def _split_dimension(module: nn.Module, style: Any) -> tuple[str, int] | None:
    """The size a style splits ``module`` along (None when it splits no parameter of a known layer)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if isinstance(style, ColwiseParallel):
        if isinstance(module, nn.Linear):
            return "out_features", module.out_features
        if isinstance(module, nn.Embedding):
            return "embedding_dim", module.embedding_dim
    if isinstance(style, RowwiseParallel):
        if isinstance(module, nn.Linear):
            return "in_features", module.in_features
        if isinstance(module, nn.Embedding):
            return "num_embeddings", module.num_embeddings
    return None


def check_plan(
    model: nn.Module, plan: Mapping[str, Any], tp_size: int, precision: Precision | None = None
) -> dict[str, Any]:
    """The plan with styles built; raises ValueError for a pattern that matches nothing, or a layer whose
    split dimension ``tp_size`` does not divide (torch would shard it unevenly without a word).

    precision: asked for its own style of each entry (``Precision.parallel_style``: torchao's float8
    styles for float8 layers)."""
    styles: dict[str, Any] = {}
    for key, value in plan.items():
        style = make_style(value, key)
        matches = plan_targets(model, key)
        for name, module in matches:
            split = _split_dimension(module, style)
            if split is not None and split[1] % tp_size:
                raise ValueError(
                    f"tp_size={tp_size} must divide {name}.{split[0]}={split[1]} ({type(style).__name__} splits it): "
                    f"choose a tp_size that divides it, or leave {name} out of the plan."
                )
        styles[key] = style if precision is None else precision.parallel_style(style, [m for _, m in matches])
    return styles


def apply_tensor_parallel(
    model: nn.Module, tp_mesh: DeviceMesh, config: ParallelismConfig, precision: Precision | None = None
) -> nn.Module:
    """Splits ``model`` over ``tp_mesh``; returns the model. Collective over ``tp_mesh``.

    precision: swaps the plan's styles for its own (``Precision.parallel_style``); a ``parallelize_fn``
    or the model's own ``parallelize`` chooses its styles itself."""
    from torch.distributed.tensor.parallel import parallelize_module

    if config.parallelize_fn is not None:
        result = config.parallelize_fn(model, tp_mesh)
        return model if result is None else result
    plan: Mapping[str, Any] | None = config.tp_plan
    parallelize = getattr(model, "parallelize", None)  # a model that knows how to split itself
    if plan is None and callable(parallelize):
        result = parallelize(tp_mesh)
        return model if result is None else cast(nn.Module, result)
    if plan is None:
        plan = getattr(model, "tp_plan", None)
    if not plan:
        raise ValueError(
            f"tp_size={tp_mesh.size()} but nothing says how to split {type(model).__name__}: pass "
            "ParallelismConfig(tp_plan={'layers.*.attn.q': 'colwise', 'layers.*.attn.o': 'rowwise', ...}) or "
            "parallelize_fn=fn(model, tp_mesh), or give the model a tp_plan attribute or a parallelize(mesh) method."
        )
    return parallelize_module(model, tp_mesh, check_plan(model, plan, tp_mesh.size(), precision))
