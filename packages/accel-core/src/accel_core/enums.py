"""String enums of the public API. No torch import."""

from __future__ import annotations

from enum import Enum


class _StrEnum(str, Enum):
    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
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
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"


class RNGType(_StrEnum):
    TORCH = "torch"
    CUDA = "cuda"
    XPU = "xpu"
    XLA = "xla"
    GENERATOR = "generator"


class DynamoBackend(_StrEnum):
    NO = "no"
    EAGER = "eager"
    AOT_EAGER = "aot_eager"
    INDUCTOR = "inductor"
    CUDAGRAPHS = "cudagraphs"
    ONNXRT = "onnxrt"
    TVM = "tvm"
    IPEX = "ipex"


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
