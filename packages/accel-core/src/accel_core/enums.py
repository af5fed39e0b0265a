"""String enums of the public API, with every member of the reference's (so comparisons never raise). No torch
import."""

from __future__ import annotations

from enum import Enum, EnumMeta
from typing import Any


class _ContainsValues(EnumMeta):
    # `"fp16" in PrecisionType` answers by value, as the reference's enums do (Python < 3.12 raises TypeError).
    def __contains__(cls, item: Any) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class _StrEnum(str, Enum, metaclass=_ContainsValues):
    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        """The members' values, e.g. ``PrecisionType.list() == ['no', 'fp16', 'bf16', 'fp8']``."""
        return [member.value for member in cls]


class DistributedType(_StrEnum):
    """How the processes train together. A strategy declares which one it is.

    accel runs NO, MULTI_CPU, MULTI_GPU, MULTI_XPU, FSDP, DEEPSPEED and MEGATRON_LM; the other
    members exist so that scripts comparing against them (``MULTI_NPU``, ...) keep working.
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    TPU = "XLA"  # the reference API's older name for XLA


class PrecisionType(_StrEnum):
    """The mixed-precision modes (``Accelerator(mixed_precision=...)``); fp8 needs a backend package."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class FP8BackendType(_StrEnum):
    """The library fp8 training runs on: ``AO`` (torchao), ``TE`` (Transformer-Engine); ``NO`` when none.
    ``MSAMP`` exists for comparisons in reference scripts; accel does not run MS-AMP."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class RNGType(_StrEnum):
    """The random number generators that can be synchronised across processes (``rng_types=``)."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class DynamoBackend(_StrEnum):
    """A ``torch.compile`` backend. Values are the names torch.compile takes (lowercase); the
    reference's uppercase spelling is accepted too: ``DynamoBackend("INDUCTOR") is DynamoBackend.INDUCTOR``."""

    NO = "no"
    EAGER = "eager"
    AOT_EAGER = "aot_eager"
    INDUCTOR = "inductor"
    AOT_TS_NVFUSER = "aot_ts_nvfuser"
    NVPRIMS_NVFUSER = "nvprims_nvfuser"
    CUDAGRAPHS = "cudagraphs"
    OFI = "ofi"
    FX2TRT = "fx2trt"
    ONNXRT = "onnxrt"
    TENSORRT = "tensorrt"
    AOT_TORCHXLA_TRACE_ONCE = "aot_torchxla_trace_once"
    TORCHXLA_TRACE_ONCE = "torchxla_trace_once"
    TVM = "tvm"
    HPU_BACKEND = "hpu_backend"
    NEURON = "neuron"
    IPEX = "ipex"

    @classmethod
    def _missing_(cls, value: object) -> DynamoBackend | None:
        if isinstance(value, str) and value.lower() != value:
            member = cls._value2member_map_.get(value.lower())
            return member if isinstance(member, cls) else None
        return None


class DDPCommunicationHookType(_StrEnum):
    """The communication hook ``DistributedDataParallelKwargs(comm_hook=...)`` registers on a DDP model.

    NO: plain all-reduce; FP16 / BF16: gradients sent compressed to that dtype; POWER_SGD /
    BATCHED_POWER_SGD: low-rank gradient approximations (torch's ``powerSGD_hook``).
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class SchedulerStepping(_StrEnum):
    """How many scheduler steps one optimizer step makes (``Accelerator(scheduler_stepping=...)``).

    PER_PROCESS (default, as Accelerate): one per data-parallel process, one with ``split_batches``,
    so a schedule sized from the DataLoader's length before ``prepare`` fits the run on any number
    of processes. PER_OPTIMIZER_STEP: one, whatever the number of processes; size schedules from
    the prepared loader.
    """

    PER_PROCESS = "per_process"
    PER_OPTIMIZER_STEP = "per_optimizer_step"
