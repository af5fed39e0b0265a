"""accel-fp8: fp8 training for accel, on torchao (CPU and GPU) or NVIDIA Transformer-Engine (GPU).

Installed with ``pip install "accel[fp8]"``, it registers the ``fp8`` precision (entry point group
``accel.precisions``): ``Accelerator(mixed_precision="fp8")`` then converts each prepared model's
linear layers in the first model transform, before tensor parallelism and sharding. Names are
imported on first use: ``import accel_fp8`` imports neither torch nor torchao.

Example::

    from accel import Accelerator
    from accel.utils import AORecipeKwargs

    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(recipe_name="tensorwise")])
    model, optimizer = accelerator.prepare(model, optimizer)
    print(accelerator.precision.report.summary())     # which layers run in fp8, which stayed in bf16 and why
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "make_precision": "factory",
    "fp8_fallback": "factory",
    "check_cuda_fp8_capability": "factory",
    "AOFloat8Precision": "ao",
    "convert_model_to_fp8_ao": "ao",
    "has_ao_layers": "ao",
    "TEFloat8Precision": "te",
    "convert_model": "te",
    "has_transformer_engine_layers": "te",
    "apply_fp8_autowrap": "te",
    "contextual_fp8_autocast": "te",
    "ConversionReport": "report",
    "filter_linear_layers": "report",
    "filter_first_and_last_linear_layers": "report",
    "find_first_last_linear_layers": "report",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), {n: f".{m}" for n, m in _EXPORTS.items()})
