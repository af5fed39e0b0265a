"""bf16 on a GPU that only emulates it (V100, T4) is refused with the fix named; the GPU's answers are faked.

torch.cuda.is_bf16_supported() says yes there by default (it counts emulation); asked without emulation it says
no, which is what the check asks.
"""

from __future__ import annotations

import pytest
import torch

from accel_core.precision.choice import cuda_computes_bf16
from accel_core.precision.modes import AutocastPrecision, PrecisionContext
from accel_core.strategies import create_strategy


def _gpu(monkeypatch: pytest.MonkeyPatch, native_bf16: bool) -> None:
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return native_bf16 or including_emulation  # emulation: always possible on a CUDA GPU

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)


def test_an_emulating_gpu_is_refused_with_fp16_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch, native_bf16=False)
    assert torch.cuda.is_bf16_supported()  # torch's default answer: yes, by emulation
    assert not cuda_computes_bf16()
    with pytest.raises(ValueError, match=r"only emulates it.*mixed_precision='fp16'"):
        create_strategy("ddp").make_precision("bf16", PrecisionContext(torch.device("cuda", 0)))


def test_a_native_bf16_gpu_gets_bf16_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu(monkeypatch, native_bf16=True)
    precision = create_strategy("ddp").make_precision("bf16", PrecisionContext(torch.device("cuda", 0)))
    assert isinstance(precision, AutocastPrecision) and precision.dtype == torch.bfloat16


def test_fp16_on_the_cpu_trains_but_says_bf16_is_the_cpus_mixed_precision(caplog: pytest.LogCaptureFixture) -> None:
    """torch's float16 CPU kernels are some 60x slower than float32 (measured: 446 vs 6.7 ms a step for a small
    conv net): fp16 there is allowed, once said on the main process, with the fix."""
    with caplog.at_level("WARNING", logger="accel"):
        precision = create_strategy("ddp").make_precision("fp16", PrecisionContext(torch.device("cpu")))
    assert isinstance(precision, AutocastPrecision) and precision.scaler is not None
    assert [r.getMessage() for r in caplog.records if "fp16 on the CPU" in r.getMessage()], caplog.text
    assert "--mixed-precision bf16" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="accel"):
        create_strategy("ddp").make_precision("fp16", PrecisionContext(torch.device("cpu"), is_main_process=False))
        create_strategy("ddp").make_precision("bf16", PrecisionContext(torch.device("cpu")))
    assert "fp16 on the CPU" not in caplog.text
