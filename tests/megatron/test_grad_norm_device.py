"""accel-megatron's gradient norm on a process with no gradient to count asks accel-core where to all-reduce.

Under NCCL that is the current GPU (``accel_core.grads.communication_device``, tested in tests/core): before,
such a process all-reduced a CPU zero, which NCCL refuses. One process (a group of one over gloo) and Megatron's
groups of one; the helper is wrapped to record what it was asked and answered.

Slow: importing Megatron-core in the pytest process takes many seconds (torch._dynamo, torchao), so the import is
made by the fixture, not at collection, where every run of the suite, the fast lane included, would pay it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from accel_core.strategies.groups import join_group_of_one

pytestmark = pytest.mark.slow


@pytest.fixture
def grads():
    """accel_megatron.grads, with Megatron's groups of one set up around the test."""
    from accel_megatron.groups import import_megatron

    import_megatron()
    from megatron.core import parallel_state

    from accel_megatron import grads

    started = not dist.is_initialized()
    join_group_of_one(1, backend="gloo")  # this test is one process
    parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
    yield grads
    parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_a_process_without_gradients_reduces_where_the_backend_wants(
    grads, monkeypatch: pytest.MonkeyPatch, norm_type: float
) -> None:
    asked: list[tuple[torch.device, torch.device]] = []
    real = grads.communication_device

    def recording(local: torch.device) -> torch.device:
        asked.append((local, real(local)))
        return asked[-1][1]

    monkeypatch.setattr(grads, "communication_device", recording)
    weight = torch.nn.Parameter(torch.ones(3))  # no .grad: nothing to count here
    norm = grads.total_norm([weight], norm_type)
    assert asked == [(torch.device("cpu"), torch.device("cpu"))]  # gloo: the CPU; under NCCL the GPU
    assert norm.device == asked[0][1] and norm.item() == 0.0
