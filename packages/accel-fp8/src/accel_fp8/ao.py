"""fp8 training with torchao: ``nn.Linear`` layers become ``Float8Linear``, the rest computes under bf16 autocast.

torchao's float8 linear runs on the CPU too (``torch._scaled_mm`` has a CPU kernel), so this backend is
tested there; on CUDA it needs compute capability >= 8.9. With FSDP2 and the tensorwise recipe the
weights are all-gathered in float8 and their scales are computed for all layers in one all-reduce
after each optimizer step; with tensor parallelism the plan's colwise / rowwise styles of converted
layers become torchao's float8 styles.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch
from torch import nn

from accel_core.precision.fp8_recipes import AORecipeKwargs
from accel_core.precision.modes import AutocastPrecision

from .report import ConversionReport, RecordingFilter

logger = logging.getLogger("accel")


def build_config(handler: AORecipeKwargs) -> Any:
    """The ``Float8LinearConfig`` of ``handler``: its own ``config``, else one from its recipe and flags."""
    import dataclasses

    from torchao.float8 import Float8LinearConfig

    if handler.config is not None:
        if not isinstance(handler.config, Float8LinearConfig):
            raise TypeError(
                f"AORecipeKwargs.config must be a torchao Float8LinearConfig, got {type(handler.config).__name__}."
            )
        return handler.config
    base = Float8LinearConfig.from_recipe_name(handler.recipe_name) if handler.recipe_name else Float8LinearConfig()
    return dataclasses.replace(
        base,
        pad_inner_dim=bool(handler.pad_inner_dim),
        enable_fsdp_float8_all_gather=bool(handler.enable_fsdp_float8_all_gather),
    )


def convert_model_to_fp8_ao(
    model: nn.Module, config: Any = None, module_filter_func: Any = None, report: ConversionReport | None = None
) -> ConversionReport:
    """Swaps ``model``'s eligible ``nn.Linear`` layers for torchao ``Float8Linear`` in place; returns the report.

    config: a ``Float8LinearConfig`` (None: torchao's default). module_filter_func: ``fn(module, fqn) -> bool``;
    None converts every linear layer of a shape fp8 takes except the first and the last (as Accelerate).

    Example::

        report = convert_model_to_fp8_ao(model)
        print(report.summary())
    """
    from torchao.float8 import convert_to_float8_training

    if report is None:
        report = ConversionReport(model=type(model).__name__, backend="torchao")
    if isinstance(model, nn.Linear):
        raise ValueError(
            "convert_model_to_fp8_ao converts the linear layers inside a model: wrap a lone nn.Linear in a module."
        )
    convert_to_float8_training(
        model, module_filter_fn=RecordingFilter(model, report, module_filter_func), config=config
    )
    return report


def plain_weight(tensor: Any) -> Any:
    """``tensor`` without torchao's float8 all-gather wrapper (``WeightWithDynamicFloat8CastTensor``), inside a
    DTensor too: the plain high-precision weight it holds, which checkpoints and safetensors can store."""
    from torch.distributed.tensor import DTensor
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    if isinstance(tensor, DTensor) and isinstance(tensor._local_tensor, WeightWithDynamicFloat8CastTensor):
        local = tensor._local_tensor._tensor.detach()  # the wrapper holds the original Parameter
        return DTensor.from_local(
            local, tensor.device_mesh, tensor.placements, run_check=False, shape=tensor.shape, stride=tensor.stride()
        )
    if isinstance(tensor, WeightWithDynamicFloat8CastTensor):
        return tensor._tensor.detach()
    return tensor


def _plain_state_dict(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    # A state_dict post-hook of each Float8Linear: its weight is saved as the plain tensor under the original name.
    key = prefix + "weight"
    if key in state_dict:
        state_dict[key] = plain_weight(state_dict[key])


def _float8_gathered() -> type:
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    return WeightWithDynamicFloat8CastTensor


def _rescale_after_load(module: nn.Module, incompatible_keys: Any) -> None:
    # Loaded weights need the scales a run that never stopped would use: those precomputed after each
    # optimizer step over the whole weight, not the per-shard ones FSDP2 computes when none is precomputed.
    # Collective over the weights' mesh, as loading a sharded model's state dict already is.
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(module)


def has_ao_layers(model: nn.Module) -> bool:
    """Whether ``model`` has a torchao ``Float8Linear`` layer."""
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


class AOFloat8Precision(AutocastPrecision):
    """The ``fp8`` precision on torchao (``Accelerator(mixed_precision="fp8")`` with torchao installed).

    handler: the ``AORecipeKwargs`` (recipe, filter, FSDP float8 all-gather). is_main_process: logs the
    conversion report there. The reports of the models converted so far are ``reports`` (``report``: the last).
    """

    backend = "AO"

    def __init__(
        self,
        device_type: str,
        handler: AORecipeKwargs,
        is_main_process: bool = True,
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__("fp8", device_type, autocast_kwargs=autocast_kwargs)
        self.handler = handler
        self.config = build_config(handler)
        self.is_main_process = is_main_process
        self.reports: list[ConversionReport] = []
        self._models: list[weakref.ref[nn.Module]] = []

    @property
    def report(self) -> ConversionReport | None:
        """The conversion report of the last model prepared (None before any)."""
        return self.reports[-1] if self.reports else None

    def convert_module(self, module: nn.Module) -> nn.Module:
        from torchao.float8.float8_linear import Float8Linear

        if any(module is ref() for ref in self._models):
            return module  # prepared before: converted and hooked already
        if has_ao_layers(module):
            # Converted by the script itself: reported as it is, hooked like ours.
            found = [name for name, layer in module.named_modules() if isinstance(layer, Float8Linear)]
            report = ConversionReport(model=type(module).__name__, backend="torchao", converted=found)
        else:
            report = convert_model_to_fp8_ao(module, self.config, self.handler.module_filter_func)
        for layer in module.modules():
            if isinstance(layer, Float8Linear):
                layer.register_state_dict_post_hook(_plain_state_dict)
        if any(isinstance(getattr(layer, "weight", None), _float8_gathered()) for layer in module.modules()):
            module.register_load_state_dict_post_hook(_rescale_after_load)
        self.reports.append(report)
        self._models.append(weakref.ref(module))
        if self.is_main_process:
            logger.info(report.summary())
            if not report.converted:
                logger.warning(
                    "fp8: no layer of %s could be converted; it trains in bf16 (%s).", report.model, report.skipped
                )
        return module

    def parallel_style(self, style: Any, modules: list[nn.Module]) -> Any:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
        from torchao.float8.config import ScalingGranularity
        from torchao.float8.float8_linear import Float8Linear
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

        # torchao's styles cast the layer's input to float8 before it is redistributed; they assume tensorwise scales.
        tensorwise = self.config.cast_config_input.scaling_granularity is ScalingGranularity.TENSORWISE
        if not tensorwise or not modules or not all(isinstance(m, Float8Linear) for m in modules):
            return style
        float8_style = {ColwiseParallel: Float8ColwiseParallel, RowwiseParallel: Float8RowwiseParallel}.get(type(style))
        if float8_style is None:
            return style
        return float8_style(
            input_layouts=style.input_layouts[0],
            output_layouts=style.output_layouts[0],
            use_local_output=style.use_local_output,
        )

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        skipped = super().optimizer_step(optimizer, **kwargs)
        if not skipped and self.config.enable_fsdp_float8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            # One all-reduce for every float8 weight's scale, instead of one per layer in the next forward
            # (a no-op for models that FSDP2 does not shard).
            for ref in self._models:
                model = ref()
                if model is not None:
                    precompute_float8_dynamic_scale_for_fsdp(model)
        return skipped
