"""String enums of the public API. No torch import."""

from __future__ import annotations

from enum import Enum


class _StrEnum(str, Enum):
    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        """The members' values, e.g. ``PrecisionType.list() == ['no', 'fp16', 'bf16', 'fp8']``."""
        return [member.value for member in cls]


class DistributedType(_StrEnum):
    """How the processes train together. A strategy declares which one it is."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    FSDP = "FSDP"
    DEEPSPEED = "DEEPSPEED"
    MEGATRON_LM = "MEGATRON_LM"
    XLA = "XLA"
    TPU = "XLA"  # the reference API's older name for XLA


class PrecisionType(_StrEnum):
    """The mixed-precision modes (``Accelerator(mixed_precision=...)``); fp8 needs a backend package."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"


class RNGType(_StrEnum):
    """The random number generators that can be synchronised across processes (``rng_types=``)."""

    TORCH = "torch"
    CUDA = "cuda"
    XPU = "xpu"
    XLA = "xla"
    GENERATOR = "generator"


class DynamoBackend(_StrEnum):
    """The ``torch.compile`` backends ``Accelerator(dynamo_backend=...)`` accepts."""

    NO = "no"
    EAGER = "eager"
    AOT_EAGER = "aot_eager"
    INDUCTOR = "inductor"
    CUDAGRAPHS = "cudagraphs"
    ONNXRT = "onnxrt"
    TVM = "tvm"
    IPEX = "ipex"
