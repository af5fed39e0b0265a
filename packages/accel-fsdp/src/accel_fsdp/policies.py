"""From plugin values to torch objects: the device mesh, mixed-precision policies, the units to wrap.

The choice of units is one traversal shared by FSDP1 and FSDP2, so both versions shard a model
into the same pieces for the same plugin.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .plugin import FullyShardedDataParallelPlugin

_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}
_ACCELERATOR_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_FSDP2_MP_FIELDS = {"param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"}
_FSDP1_MP_FIELDS = {
    "param_dtype",
    "reduce_dtype",
    "buffer_dtype",
    "keep_low_precision_grads",
    "cast_forward_inputs",
    "cast_root_forward_inputs",
}


def to_dtype(value: Any, what: str) -> Any:
    """A ``torch.dtype`` from a dtype or a name (``"bf16"``, ``"float32"``); other values pass through."""
    if value is None or isinstance(value, (torch.dtype, bool)):
        return value
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("torch.")
        if key in _DTYPES:
            return _DTYPES[key]
    raise ValueError(f"{what}={value!r} is not a dtype; use one of {', '.join(sorted(_DTYPES))} or a torch.dtype.")


def _precision_dtype(precision: Any) -> torch.dtype | None:
    """The dtype parameters are computed in: a Precision object's ``param_dtype``, or from a mode name."""
    if isinstance(precision, str):
        return _ACCELERATOR_DTYPES.get(precision)
    return precision.param_dtype


def _mixed_precision_fields(spec: Any, precision: Any) -> dict[str, Any]:
    if spec is None:
        dtype = _precision_dtype(precision)
        # Gather and compute in low precision, reduce gradients in fp32: the sharded fp32 parameters
        # are the master weights, and summing gradients in bf16 loses bits that fp32 keeps.
        return {} if dtype is None else {"param_dtype": dtype, "reduce_dtype": torch.float32}
    if isinstance(spec, (str, torch.dtype)):
        return {"param_dtype": to_dtype(spec, "mixed_precision_policy"), "reduce_dtype": torch.float32}
    if isinstance(spec, dict):
        items = dict(spec)
    else:  # a MixedPrecisionPolicy / MixedPrecision dataclass of either FSDP version
        items = {name: getattr(spec, name) for name in _FSDP1_MP_FIELDS | _FSDP2_MP_FIELDS if hasattr(spec, name)}
    return {
        key: to_dtype(value, f"mixed_precision_policy[{key!r}]") if key.endswith("dtype") else value
        for key, value in items.items()
    }


def fsdp2_mixed_precision(spec: Any, precision: Any) -> Any:
    """The ``MixedPrecisionPolicy`` for ``fully_shard``: the plugin's ``spec``, else the Precision object's own policy.

    precision: the Accelerator's ``Precision`` (or a mode name such as ``"bf16"``).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(spec, MixedPrecisionPolicy):
        return spec
    if spec is None and not isinstance(precision, str):
        return precision.mixed_precision_policy()
    fields = _mixed_precision_fields(spec, precision)
    if isinstance(spec, dict):
        unknown = set(fields) - _FSDP2_MP_FIELDS
        if unknown:
            raise ValueError(
                f"mixed_precision_policy keys {sorted(unknown)} do not exist in FSDP2's MixedPrecisionPolicy; "
                f"use {sorted(_FSDP2_MP_FIELDS)} (buffers are not cast by FSDP2: they keep their dtype)."
            )
    return MixedPrecisionPolicy(**{k: v for k, v in fields.items() if k in _FSDP2_MP_FIELDS})


def fsdp1_mixed_precision(spec: Any, precision: Any) -> Any:
    """The ``MixedPrecision`` for ``FullyShardedDataParallel``, or None for full precision.

    precision: the Accelerator's ``Precision`` (or a mode name).
    """
    from torch.distributed.fsdp import MixedPrecision

    if isinstance(spec, MixedPrecision):
        return spec
    fields = _mixed_precision_fields(spec, precision)
    if isinstance(spec, dict):
        unknown = set(fields) - _FSDP1_MP_FIELDS
        if unknown:
            raise ValueError(
                f"mixed_precision_policy keys {sorted(unknown)} do not exist in FSDP1's MixedPrecision; use "
                f"{sorted(_FSDP1_MP_FIELDS)}."
            )
    kept = {k: v for k, v in fields.items() if k in _FSDP1_MP_FIELDS}
    return MixedPrecision(**kept) if kept else None


def reshard_after_forward(plugin: FullyShardedDataParallelPlugin) -> bool | int:
    """FSDP2's ``reshard_after_forward``, for every unit and the root.

    Explicitly True for the root too (fully_shard's own default leaves the root gathered after
    forward): after a forward without backward (evaluation, a probe), a root left gathered exposes its
    unsharded tensors as ``parameters()``, which the optimizer and the state-dict functions do not know.
    """
    if plugin.reshard_after_forward is not None:
        return plugin.reshard_after_forward
    return plugin.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")


def ignored_modules(model: nn.Module, spec: Any) -> list[nn.Module]:
    """The modules FSDP must leave alone: given as modules, or as a regex matched against module names."""
    if spec is None:
        return []
    if isinstance(spec, str):
        pattern = re.compile(spec)
        found = [module for name, module in model.named_modules() if name and pattern.fullmatch(name)]
        if not found:
            raise ValueError(
                f"ignored_modules={spec!r} matches no module name of {type(model).__name__}; check the pattern."
            )
        return found
    modules = list(spec)
    inside = {id(m) for m in model.modules()}
    stray = [type(m).__name__ for m in modules if not isinstance(m, nn.Module) or id(m) not in inside]
    if stray:
        raise ValueError(f"ignored_modules must be submodules of the model being prepared; these are not: {stray}.")
    return modules


def transformer_class_names(model: nn.Module, plugin: FullyShardedDataParallelPlugin) -> set[str]:
    names = plugin.transformer_cls_names_to_wrap or list(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(
            "auto_wrap_policy=TRANSFORMER_BASED_WRAP needs the layer classes to wrap: pass "
            "transformer_cls_names_to_wrap=['MyBlock'] (or ACCEL_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP=MyBlock)."
        )
    present = {type(m).__name__ for m in model.modules()}
    missing = [n for n in names if n not in present]
    if missing:
        raise ValueError(
            f"Could not find the transformer layer class(es) {missing} in {type(model).__name__}; its module classes "
            f"are {sorted(present)}."
        )
    return set(names)


def units_to_wrap(
    model: nn.Module, plugin: FullyShardedDataParallelPlugin, ignored: list[nn.Module]
) -> list[nn.Module]:
    """Submodules that become their own FSDP unit, children before parents (the root is not listed)."""
    policy = plugin.auto_wrap_policy
    if policy == "NO_WRAP":
        return []
    predicate: Callable[[nn.Module, int], bool]
    if policy == "TRANSFORMER_BASED_WRAP":
        names = transformer_class_names(model, plugin)
        predicate = lambda module, numel: type(module).__name__ in names  # noqa: E731
    elif policy == "SIZE_BASED_WRAP":
        threshold = plugin.min_params
        predicate = lambda module, numel: numel >= threshold  # noqa: E731
    elif callable(policy):
        # An FSDP1-style policy function, asked the question FSDP1 asks after visiting the children.
        predicate = lambda module, numel: bool(policy(module=module, recurse=False, nonwrapped_numel=numel))  # noqa: E731
    else:  # pragma: no cover - the plugin validated the name
        raise ValueError(f"Unknown auto_wrap_policy {policy!r}.")

    skipped = {id(m) for root in ignored for m in root.modules()}
    counted: set[int] = {id(p) for root in ignored for p in root.parameters()}
    chosen: list[nn.Module] = []

    def visit(module: nn.Module) -> int:
        if id(module) in skipped:
            return 0
        numel = 0
        for child in module.children():
            numel += visit(child)
        for param in module.parameters(recurse=False):
            if id(param) not in counted:  # a tied parameter counts once, in the first unit that holds it
                counted.add(id(param))
                numel += param.numel()
        if module is not model and predicate(module, numel):
            chosen.append(module)
            return 0
        return numel

    visit(model)
    return chosen
