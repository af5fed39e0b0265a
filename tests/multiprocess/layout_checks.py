"""Helpers shared by the multi-process layout scripts (tests/parallelism/mesh_checks.py,
tests/pipeline/pipeline_checks.py): rank 0 narrates, and every rank rebuilds the step's global batch to train the
one-process reference on (expecting, as it does, that peers of one data-parallel rank got the same rows).

The scripts run under torchrun from their own folder; they put this folder on ``sys.path`` first.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from checklist import expect

if TYPE_CHECKING:
    from accel import Accelerator

RANK = int(os.environ["RANK"])


def say(message: str) -> None:
    if RANK == 0:
        print(message, flush=True)


def global_batch(accelerator: Accelerator, batch: torch.Tensor) -> torch.Tensor:
    """The step's global batch; checks that peers of one dp rank (pipeline, tensor, context peers) got the same rows
    and that there are as many distinct dp ranks as the mesh says."""
    everyone: list = [None] * accelerator.num_processes
    dist.all_gather_object(everyone, (accelerator.parallel_dims.dp.rank, batch.tolist()))
    by_dp: dict[int, list] = {}
    for dp_rank, rows in everyone:
        expect(
            by_dp.setdefault(dp_rank, rows) == rows, f"processes of data-parallel rank {dp_rank} got different batches"
        )
    expect(
        len(by_dp) == accelerator.parallel_dims.dp.size,
        f"{len(by_dp)} distinct dp ranks, expected {accelerator.parallel_dims.dp.size}",
    )
    return torch.tensor([row for dp_rank in sorted(by_dp) for row in by_dp[dp_rank]])


def mean_over_world(value: torch.Tensor) -> float:
    total = value.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()
