"""The harness's own 2-process script (gloo) for the one unsafe case: rank 1 fails before a collective that rank 0
enters. Rank 1 waits CHECK_SYNC_TIMEOUT for rank 0, records the abort and exits; the launcher stops rank 0.
Run by tests/harness/test_harness.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks

dist.init_process_group("gloo")
RANK = dist.get_rank()


@check
def first_passes() -> None:
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    expect(tensor.item() == 2.0, "two ranks")


@check
def fails_before_a_collective() -> None:
    expect(RANK != 1, "rank 1 fails before the all_reduce rank 0 waits in")
    dist.all_reduce(torch.ones(1))


@check
def never_reached() -> None:
    expect(True, "")


if __name__ == "__main__":
    run_checks(teardown=dist.destroy_process_group)
