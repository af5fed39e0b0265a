"""fp8 training with NVIDIA Transformer-Engine: ``te.Linear`` / ``te.LayerNorm`` layers run under ``fp8_autocast``.

Transformer-Engine needs CUDA (compute capability >= 8.9 for fp8) and is the ``te`` extra of accel-fp8.
The model's ``nn.Linear`` layers of a shape fp8 takes (dimensions divisible by 16) and its
``nn.LayerNorm`` layers are replaced by Transformer-Engine's, weights copied; the forward runs inside
bf16 autocast and ``fp8_autocast`` with a ``DelayedScaling`` recipe built from ``TERecipeKwargs``
(``MXFP8BlockScaling`` with ``use_mxfp8_block_scaling``). In eval mode fp8 is off unless
``use_autocast_during_eval``. Transformer-Engine layers split themselves for tensor parallelism, so
torch tensor-parallel plans over them are refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

import torch
from torch import nn

from accel_core.precision.fp8_recipes import TERecipeKwargs
from accel_core.precision.modes import AutocastForward, AutocastPrecision

from .report import ConversionReport, fp8_shape_problem

_INSTALL = 'pip install "accel-fp8[te]" (on a CUDA machine with its toolkit)'


def import_te() -> Any:
    """``transformer_engine.pytorch``, or an ImportError naming the extra to install."""
    try:
        import transformer_engine.pytorch as te  # pyright: ignore[reportMissingImports]
    except ImportError as error:
        raise ImportError(
            f"The Transformer-Engine fp8 backend needs transformer_engine: {_INSTALL}; or use torchao, which runs "
            f"on CPU too: AORecipeKwargs or ACCEL_FP8_BACKEND=AO. ({error})"
        ) from error
    return te


def te_autocast(te: Any, enabled: bool, recipe: Any) -> Any:
    """Transformer-Engine's fp8 autocast context: ``te.autocast`` (2.8 and later), else ``te.fp8_autocast``."""
    if hasattr(te, "autocast"):
        return te.autocast(enabled=enabled, recipe=recipe)
    return te.fp8_autocast(enabled=enabled, fp8_recipe=recipe)


def recipe_from(handler: TERecipeKwargs | None) -> Any:
    """Transformer-Engine's recipe object for ``handler`` (``DelayedScaling``, or ``MXFP8BlockScaling``)."""
    import_te()
    import transformer_engine.common.recipe as te_recipe  # pyright: ignore[reportMissingImports]

    kwargs = dict(handler.to_kwargs()) if handler is not None else {}
    for name in ("use_autocast_during_eval", "backend", "opt_level"):
        kwargs.pop(name, None)
    if kwargs.pop("use_mxfp8_block_scaling", False):
        from transformer_engine.pytorch.fp8 import check_mxfp8_support  # pyright: ignore[reportMissingImports]

        available, why = check_mxfp8_support()
        if not available:
            raise ValueError(f"MXFP8 block scaling is not available here: {why}")
        return te_recipe.MXFP8BlockScaling(fp8_format=getattr(te_recipe.Format, kwargs.get("fp8_format", "E4M3")))
    if "fp8_format" in kwargs:
        kwargs["fp8_format"] = getattr(te_recipe.Format, kwargs["fp8_format"])
    accepted = {field.name for field in dataclasses.fields(te_recipe.DelayedScaling)}
    return te_recipe.DelayedScaling(**delayed_scaling_kwargs(kwargs, accepted))


# TERecipeKwargs's fields that some Transformer-Engine versions' DelayedScaling lacks, and the value meaning "unset".
_VERSION_DEPENDENT = {"interval": 1, "override_linear_precision": (False, False, False)}


def delayed_scaling_kwargs(settings: dict[str, Any], accepted: Collection[str]) -> dict[str, Any]:
    """``settings`` as arguments of a ``DelayedScaling`` whose fields are ``accepted``.

    Transformer-Engine 2 dropped ``interval`` and ``override_linear_precision``, and its recipe (a pydantic
    dataclass) ignores unknown arguments silently: a setting it would drop is refused here instead, unless it
    is the value that changes nothing.
    """
    kwargs = dict(settings)
    for name, unset in _VERSION_DEPENDENT.items():
        if name in accepted or name not in kwargs:
            continue
        value = kwargs.pop(name)
        if _is_set(value, unset):
            raise ValueError(
                f"TERecipeKwargs({name}={value!r}): this Transformer-Engine's DelayedScaling has no {name!r} (removed "
                f"in Transformer-Engine 2; it would be ignored). Leave {name} unset (or {unset!r}), or install a "
                "Transformer-Engine 1.x that has it."
            )
    return kwargs


def _is_set(value: Any, unset: Any) -> bool:
    if value is None:
        return False
    if isinstance(unset, tuple):
        return tuple(value) != unset
    return value != unset


def convert_model(
    model: nn.Module, to_transformer_engine: bool = True, report: ConversionReport | None = None
) -> ConversionReport:
    """Replaces ``model``'s ``nn.Linear`` (dimensions divisible by 16) and ``nn.LayerNorm`` layers by
    Transformer-Engine's in place, copying weights; ``to_transformer_engine=False`` converts back. Returns the report.

    Example::

        report = convert_model(model.cuda())
    """
    te = import_te()
    if report is None:
        report = ConversionReport(model=type(model).__name__, backend="transformer-engine")
    for name, child in list(model.named_modules()):
        for child_name, module in list(child.named_children()):
            fqn = f"{name}.{child_name}" if name else child_name
            replacement = _converted(te, module, to_transformer_engine, fqn, report)
            if replacement is not None:
                setattr(child, child_name, replacement)
    return report


@torch.no_grad()
def _converted(te: Any, module: Any, to_te: bool, fqn: str, report: ConversionReport) -> nn.Module | None:
    new: Any
    if to_te and type(module) is nn.Linear:
        problem = fp8_shape_problem(module)
        if problem is not None:
            report.skipped[fqn] = problem
            return None
        new = te.Linear(
            module.in_features, module.out_features, bias=module.bias is not None, params_dtype=module.weight.dtype
        )
    elif to_te and type(module) is nn.LayerNorm:
        if len(module.normalized_shape) != 1 or not module.elementwise_affine:
            report.skipped[fqn] = "LayerNorm over several dimensions or without affine weights"
            return None
        new = te.LayerNorm(module.normalized_shape[0], eps=module.eps, params_dtype=module.weight.dtype)
    elif not to_te and isinstance(module, te.Linear):
        new = nn.Linear(
            module.in_features,
            module.out_features,
            bias=getattr(module, "bias", None) is not None,
            dtype=module.weight.dtype,
        )
    elif not to_te and isinstance(module, te.LayerNorm):
        new = nn.LayerNorm(module.weight.shape[0], eps=module.eps, dtype=module.weight.dtype)
    else:
        return None
    new.to(module.weight.device)
    new.weight.copy_(module.weight)
    bias = getattr(module, "bias", None)
    if bias is not None and getattr(new, "bias", None) is not None:
        new.bias.copy_(bias)
    report.converted.append(fqn)
    return new


def has_transformer_engine_layers(model: nn.Module) -> bool:
    """Whether ``model`` has a Transformer-Engine ``Linear``, ``LayerNorm`` or ``TransformerLayer``."""
    te = import_te()
    return any(isinstance(m, (te.Linear, te.LayerNorm, te.TransformerLayer)) for m in model.modules())


class FP8AutocastForward(AutocastForward):
    """``model.forward`` under bf16 autocast and Transformer-Engine's ``fp8_autocast`` (off in eval mode unless
    ``use_during_eval``); removed by ``unwrap_forward`` like the plain autocast wrapper."""

    def __init__(
        self,
        module: nn.Module,
        original: Any,
        device_type: str,
        kwargs: dict[str, Any],
        recipe: Any,
        use_during_eval: bool,
    ):
        super().__init__(module, original, device_type, torch.bfloat16, kwargs)
        self.recipe, self.use_during_eval = recipe, use_during_eval

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        te = import_te()
        with te_autocast(te, self.use_during_eval or self.module.training, self.recipe):
            return super().__call__(*args, **kwargs)


def contextual_fp8_autocast(model_forward: Any, fp8_recipe: Any, use_during_eval: bool = False) -> Any:
    """A ``forward(self, *args, **kwargs)`` running ``model_forward`` under ``fp8_autocast`` with ``fp8_recipe``,
    off in eval mode unless ``use_during_eval`` (Accelerate's function; bind it with ``types.MethodType``)."""
    te = import_te()

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with te_autocast(te, use_during_eval or self.training, fp8_recipe):
            return model_forward(*args, **kwargs)

    forward.__wrapped__ = model_forward  # pyright: ignore[reportFunctionMemberAccess]  # unwrap_forward reads it
    return forward


def apply_fp8_autowrap(model: nn.Module, fp8_recipe_handler: TERecipeKwargs | None) -> nn.Module:
    """Makes ``model.forward`` run under ``fp8_autocast`` with the handler's recipe (Accelerate's function);
    returns ``model``."""
    use_during_eval = bool(fp8_recipe_handler.use_autocast_during_eval) if fp8_recipe_handler is not None else False
    device_type = next((p.device.type for p in model.parameters()), "cuda")
    model.forward = FP8AutocastForward(
        model, model.forward, device_type, {}, recipe_from(fp8_recipe_handler), use_during_eval
    )
    return model


class TEFloat8Precision(AutocastPrecision):
    """The ``fp8`` precision on Transformer-Engine (``TERecipeKwargs``, or ``ACCEL_FP8_BACKEND=TE``).

    handler: the recipe settings (None: ``TERecipeKwargs()``, Accelerate's defaults with the run's ``ACCEL_FP8_*``).
    is_main_process: logs the conversion report there. environ: the run's settled variables (``RunSettings.environ``).
    """

    backend = "TE"

    def __init__(
        self,
        device_type: str,
        handler: TERecipeKwargs | None,
        is_main_process: bool = True,
        autocast_kwargs: dict[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if device_type != "cuda":
            raise ValueError(
                f"The Transformer-Engine fp8 backend runs on CUDA GPUs only (this process runs on {device_type}): "
                "use torchao (AORecipeKwargs, or ACCEL_FP8_BACKEND=AO), which runs on CPU too."
            )
        import_te()
        super().__init__("fp8", device_type, autocast_kwargs=autocast_kwargs)
        if handler is None:
            handler = TERecipeKwargs()  # Accelerate's defaults (amax_compute_algo="most_recent", ...)
            handler.apply_environment(environ or {})  # and the run's ACCEL_FP8_*, as a handler the script gave
        self.handler = handler
        self.recipe = recipe_from(handler)
        self.use_during_eval = bool(handler.use_autocast_during_eval) if handler is not None else False
        self.is_main_process = is_main_process
        self.reports: list[ConversionReport] = []

    @property
    def report(self) -> ConversionReport | None:
        """The conversion report of the last model prepared (None before any)."""
        return self.reports[-1] if self.reports else None

    def convert_module(self, module: nn.Module) -> nn.Module:
        report = convert_model(module)
        self.reports.append(report)
        if self.is_main_process:
            import logging

            logging.getLogger("accel").info(report.summary())
        return module

    def parallel_style(self, style: Any, modules: list[nn.Module]) -> Any:
        te = import_te()
        if any(isinstance(m, (te.Linear, te.LayerNorm)) for m in modules):
            raise ValueError(
                "Transformer-Engine layers cannot be split by a torch tensor-parallel plan: use the torchao fp8 "
                "backend (AORecipeKwargs) with tp_size > 1, or Transformer-Engine's own tensor parallelism."
            )
        return style

    def wrap_forward(self, model: nn.Module) -> None:
        if isinstance(model.__dict__.get("forward"), AutocastForward):
            return
        model.forward = FP8AutocastForward(
            model, model.forward, self.device_type, self.autocast_kwargs, self.recipe, self.use_during_eval
        )
