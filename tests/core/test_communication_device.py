"""Where a gradient norm is all-reduced: the current GPU under NCCL even when the process holds nothing on it.

A process with no gradient to count (an empty pipeline stage, replicated layers on tensor-parallel rank > 0)
still joins the all-reduce with a zero; NCCL refuses a CPU tensor ("No backend type associated with device
type cpu"). The backend's name and the current GPU are faked here (no GPU needed to check the choice).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from accel_core.grads import communication_device


def test_under_nccl_a_cpu_tensor_is_reduced_on_the_current_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert communication_device(torch.device("cpu")) == torch.device("cuda", 3)
    assert communication_device(torch.device("cuda", 3)) == torch.device("cuda", 3)


def test_under_gloo_the_local_device_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    assert communication_device(torch.device("cpu")) == torch.device("cpu")
