"""The ``is_*_available`` checks scripts branch on: cheap, and without importing the library they ask about.

A package check looks for the module (``importlib.util.find_spec``) and its installed distribution
(so a stray folder of that name does not count). A device check imports torch only when called.
Names and answers follow the reference's ``accelerate.utils.imports``.

Example::

    from accel.utils import is_wandb_available, is_bf16_available

    log_with = "wandb" if is_wandb_available() else None
    mixed_precision = "bf16" if is_bf16_available() else "no"
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from functools import lru_cache

from ..environment import parse_flag
from .versions import compare_versions, is_torch_version


def _is_package_available(module: str, distribution: str | None = None) -> bool:
    """Whether ``module`` can be imported and comes from an installed distribution."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):  # a parent package that fails to import, or a broken __spec__
        return False
    try:
        importlib.metadata.metadata(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _has_version(distribution: str, operation: str, version: str) -> bool:
    try:
        return compare_versions(distribution, operation, version)
    except importlib.metadata.PackageNotFoundError:
        return False


# -- libraries -------------------------------------------------------------------------------------
def is_transformers_available() -> bool:
    """Whether the ``transformers`` package is installed (found without importing it)."""
    return _is_package_available("transformers")


def is_datasets_available() -> bool:
    """Whether the ``datasets`` package is installed (found without importing it)."""
    return _is_package_available("datasets")


def is_peft_available() -> bool:
    """Whether the ``peft`` package is installed (found without importing it)."""
    return _is_package_available("peft")


def is_timm_available() -> bool:
    """Whether the ``timm`` package is installed (found without importing it)."""
    return _is_package_available("timm")


def is_torchvision_available() -> bool:
    """Whether the ``torchvision`` package is installed (found without importing it)."""
    return _is_package_available("torchvision")


def is_torchdata_available() -> bool:
    """Whether the ``torchdata`` package is installed (found without importing it)."""
    return _is_package_available("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Whether the ``torchdata`` package is installed (found without importing it)."""
    return _is_package_available("torchdata") and _has_version("torchdata", ">=", "0.8.0")


def is_schedulefree_available() -> bool:
    """Whether the ``schedulefree`` package is installed (found without importing it)."""
    return _is_package_available("schedulefree")


def is_lomo_available() -> bool:
    """Whether the ``lomo_optim`` package is installed (found without importing it)."""
    return _is_package_available("lomo_optim")


def is_deepspeed_available() -> bool:
    """Whether the ``deepspeed`` package is installed (found without importing it)."""
    return _is_package_available("deepspeed")


def is_megatron_lm_available() -> bool:
    """Whether megatron-core is installed (accel-megatron builds on megatron-core >= 0.8)."""
    return _is_package_available("megatron", "megatron-core") and _has_version("megatron-core", ">=", "0.8.0")


def is_torchao_available() -> bool:
    """Whether the ``torchao`` package is installed (found without importing it)."""
    return _is_package_available("torchao") and _has_version("torchao", ">=", "0.6.1")


def is_transformer_engine_available() -> bool:
    """Whether transformer engine is available in this environment (the reference's check of the same name)."""
    if is_hpu_available():
        return _is_package_available("intel_transformer_engine", "intel-transformer-engine")
    return _is_package_available("transformer_engine", "transformer-engine")


def is_transformer_engine_mxfp8_available() -> bool:
    """Whether transformer engine mxfp8 is available in this environment (the reference's check of the same name)."""
    if not _is_package_available("transformer_engine", "transformer-engine"):
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support  # pyright: ignore[reportMissingImports]  # optional, not installed in the workspace

    return bool(check_mxfp8_support()[0])


def is_msamp_available() -> bool:
    """Whether msamp is available in this environment (the reference's check of the same name)."""
    return _is_package_available("msamp", "ms-amp")


def is_bnb_available(min_version: str | None = None) -> bool:
    """Whether bnb is available in this environment (the reference's check of the same name)."""
    if not _is_package_available("bitsandbytes"):
        return False
    return min_version is None or _has_version("bitsandbytes", ">=", min_version)


def is_4bit_bnb_available() -> bool:
    """Whether 4bit bnb is available in this environment (the reference's check of the same name)."""
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    """Whether 8bit bnb is available in this environment (the reference's check of the same name)."""
    return is_bnb_available("0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether bitsandbytes multi backend is available in this environment (the reference's check of the same name)."""
    if not is_bnb_available():
        return False
    import bitsandbytes  # pyright: ignore[reportMissingImports]  # optional, not installed in the workspace

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_triton_available() -> bool:
    """Whether triton is available in this environment (the reference's check of the same name)."""
    if is_xpu_available():
        return _is_package_available("triton", "triton-xpu")
    return _is_package_available("triton")


def is_pippy_available() -> bool:
    """Whether pippy is available in this environment (the reference's check of the same name)."""
    return is_torch_version(">=", "2.4.0")


def is_weights_only_available() -> bool:
    """Whether weights only is available in this environment (the reference's check of the same name)."""
    return is_torch_version(">=", "2.4.0")


def is_rich_available() -> bool:
    """rich is installed and ``ACCELERATE_ENABLE_RICH`` (or ``ACCEL_ENABLE_RICH``) is set, as in the reference."""
    if not _is_package_available("rich"):
        return False
    value = next((os.environ[n] for n in ("ACCEL_ENABLE_RICH", "ACCELERATE_ENABLE_RICH") if n in os.environ), None)
    return parse_flag(value, False)


def is_pytest_available() -> bool:
    """Whether the ``pytest`` package is installed (found without importing it)."""
    return _is_package_available("pytest")


def is_import_timer_available() -> bool:
    """Whether the ``import_timer`` package is installed (found without importing it)."""
    return _is_package_available("import_timer")


def is_pynvml_available() -> bool:
    """Whether the ``pynvml`` package is installed (found without importing it)."""
    return _is_package_available("pynvml") or _is_package_available("pynvml", "nvidia-ml-py")


def is_amdsmi_available() -> bool:
    """Whether the ``amdsmi`` package is installed (found without importing it)."""
    return _is_package_available("amdsmi")


def is_boto3_available() -> bool:
    """Whether the ``boto3`` package is installed (found without importing it)."""
    return _is_package_available("boto3")


def is_sagemaker_available() -> bool:
    """Whether the ``sagemaker`` package is installed (found without importing it)."""
    return _is_package_available("sagemaker")


def is_pandas_available() -> bool:
    """Whether the ``pandas`` package is installed (found without importing it)."""
    return _is_package_available("pandas")


def is_matplotlib_available() -> bool:
    """Whether the ``matplotlib`` package is installed (found without importing it)."""
    return _is_package_available("matplotlib")


def is_tqdm_available() -> bool:
    """Whether the ``tqdm`` package is installed (found without importing it)."""
    return _is_package_available("tqdm")


# -- trackers --------------------------------------------------------------------------------------
def is_tensorboard_available() -> bool:
    """Whether the ``tensorboard`` package is installed (found without importing it)."""
    return _is_package_available("tensorboard") or _is_package_available("tensorboardX")


def is_wandb_available() -> bool:
    """Whether the ``wandb`` package is installed (found without importing it)."""
    return _is_package_available("wandb")


def is_comet_ml_available() -> bool:
    """Whether the ``comet_ml`` package is installed (found without importing it)."""
    return _is_package_available("comet_ml")


def is_mlflow_available() -> bool:
    """Whether the ``mlflow`` package is installed (found without importing it)."""
    return _is_package_available("mlflow") or _is_package_available("mlflow", "mlflow-skinny")


def is_aim_available() -> bool:
    """Whether the ``aim`` package is installed (found without importing it)."""
    return _is_package_available("aim") and _has_version("aim", "<", "4.0.0")


def is_clearml_available() -> bool:
    """Whether the ``clearml`` package is installed (found without importing it)."""
    return _is_package_available("clearml")


def is_dvclive_available() -> bool:
    """Whether the ``dvclive`` package is installed (found without importing it)."""
    return _is_package_available("dvclive")


def is_swanlab_available() -> bool:
    """Whether the ``swanlab`` package is installed (found without importing it)."""
    return _is_package_available("swanlab")


def is_trackio_available() -> bool:
    """Whether trackio is available in this environment (the reference's check of the same name)."""
    return sys.version_info >= (3, 10) and _is_package_available("trackio")


# -- devices (these import torch when called) ------------------------------------------------------
def is_cuda_available() -> bool:
    """Whether a CUDA device is usable, asked so the CUDA driver is not initialised (a fork afterwards stays safe).

    ``torch.cuda.device_count()`` asks NVML first and falls back to the runtime only where NVML cannot answer:
    the same check ``torch.cuda.is_available()`` makes under ``PYTORCH_NVML_BASED_CUDA_CHECK=1``, without
    writing that variable into the process's environment.
    """
    import torch

    return torch.cuda.device_count() > 0


def is_rocm_available() -> bool:
    """Whether rocm is available in this environment (the reference's check of the same name)."""
    import torch

    return torch.version.hip is not None and torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    """Whether mps is available in this environment (the reference's check of the same name)."""
    import torch

    return is_torch_version(">=", min_version) and torch.backends.mps.is_available() and torch.backends.mps.is_built()


def _extension_device(module: str, attribute: str, check_device: bool) -> bool:
    """An out-of-tree device (``torch_npu`` adds ``torch.npu``): installed, importable, and a device present."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):
        return False
    import torch

    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - e.g. torch_npu in a CPU-only container; the device is simply absent
        return False
    backend = getattr(torch, attribute, None)
    if backend is None:
        return False
    try:
        if check_device:
            backend.device_count()  # raises RuntimeError when no device is there
        return bool(backend.is_available())
    except RuntimeError:
        return False


@lru_cache
def is_npu_available(check_device: bool = False) -> bool:
    """Whether npu is available in this environment (the reference's check of the same name)."""
    return _extension_device("torch_npu", "npu", check_device)


@lru_cache
def is_mlu_available(check_device: bool = False) -> bool:
    """Whether mlu is available in this environment (the reference's check of the same name)."""
    return _extension_device("torch_mlu", "mlu", check_device)


@lru_cache
def is_musa_available(check_device: bool = False) -> bool:
    """Whether musa is available in this environment (the reference's check of the same name)."""
    return _extension_device("torch_musa", "musa", check_device)


@lru_cache
def is_sdaa_available(check_device: bool = False) -> bool:
    """Whether sdaa is available in this environment (the reference's check of the same name)."""
    return _extension_device("torch_sdaa", "sdaa", check_device)


@lru_cache
def is_neuron_available(check_device: bool = False) -> bool:
    """Whether neuron is available in this environment (the reference's check of the same name)."""
    return _extension_device("torch_neuronx", "neuron", check_device)


@lru_cache
def is_hpu_available(init_hccl: bool = False) -> bool:
    """Whether hpu is available in this environment (the reference's check of the same name)."""
    try:
        if (
            importlib.util.find_spec("habana_frameworks") is None
            or importlib.util.find_spec("habana_frameworks.torch") is None
        ):
            return False
    except ImportError:
        return False
    import habana_frameworks.torch  # pyright: ignore[reportMissingImports]  # optional, not installed in the workspace
    import torch

    if init_hccl:
        import habana_frameworks.torch.distributed.hccl  # noqa: F401  # pyright: ignore[reportMissingImports]  # optional
    return hasattr(torch, "hpu") and torch.hpu.is_available()  # pyright: ignore[reportAttributeAccessIssue]  # habana adds torch.hpu


def is_habana_gaudi1() -> bool:
    """Whether the HPU is a first-generation Habana Gaudi (the reference's check of the same name)."""
    if not is_hpu_available():
        return False
    import habana_frameworks.torch.utils.experimental as htexp  # pyright: ignore[reportMissingImports]  # optional, not installed in the workspace

    return bool(htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi)


@lru_cache
def is_xpu_available(check_device: bool = False) -> bool:
    """Intel XPU through stock PyTorch (>= 2.7, as the reference asks)."""
    import torch

    if is_torch_version("<=", "2.6"):
        return False
    try:
        if check_device:
            torch.xpu.device_count()
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    except RuntimeError:
        return False


@lru_cache
def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla is installed (and, if asked, runs on a TPU or a GPU); ``USE_TORCH_XLA=0`` turns it off."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available: pass check_is_tpu or check_is_gpu, not both.")
    if not parse_flag(os.environ.get("USE_TORCH_XLA"), True) or not _is_package_available("torch_xla", "torch-xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    import torch_xla.runtime  # pyright: ignore[reportMissingImports]  # optional, not installed in the workspace

    kind = torch_xla.runtime.device_type()
    return kind in ("GPU", "CUDA") if check_is_gpu else kind == "TPU"


def is_xccl_available() -> bool:
    """Whether xccl is available in this environment (the reference's check of the same name)."""
    import torch.distributed as dist

    return is_torch_version(">=", "2.7.0") and bool(dist.distributed_c10d.is_xccl_available())


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bf16 runs here: on CUDA, MLU and XPU the device is asked; the CPU always can."""
    import torch

    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_mlu_available():
        return bool(torch.mlu.is_bf16_supported())  # pyright: ignore[reportAttributeAccessIssue]  # torch_mlu adds torch.mlu
    if is_xpu_available():
        return bool(torch.xpu.is_bf16_supported())
    if is_mps_available():
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return True


def is_fp16_available() -> bool:
    """Whether fp16 is available in this environment (the reference's check of the same name)."""
    return not is_habana_gaudi1()


def is_fp8_available() -> bool:
    """Whether a library accel could run fp8 with is installed (MS-AMP, Transformer-Engine or torchao)."""
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()
