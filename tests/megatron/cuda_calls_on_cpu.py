"""Test-only: lets megatron-core's pipeline schedules run on CPU / gloo by sending their CUDA calls to the CPU.

megatron-core 0.16 makes exactly the calls listed in ``accel_megatron.pipeline.CUDA_CALLS``
whatever its config says. Inside ``cuda_calls_on_cpu()``:

- ``torch.cuda.current_device()`` answers ``"cpu"`` (receive buffers of ``P2PCommunicator``);
- a tensor factory called with ``device="cuda"`` builds it on the CPU (``total_num_tokens``);
- ``torch.cuda.synchronize()`` does nothing (CPU work is synchronous).

Everything else (Megatron's schedules, its send / receive over gloo, accel-megatron's stage
wrapper, micro-batching, loss scaling and gradient reduction) runs as on GPUs, which is what the
pipeline checks test. The library itself refuses CPU runs (``check_device``); this context is what
makes that refusal pass, by answering the very call it asks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class _CudaFactoriesOnCpu(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_calls_on_cpu() -> Iterator[None]:
    saved = torch.cuda.current_device, torch.cuda.synchronize
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    try:
        with _CudaFactoriesOnCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved
