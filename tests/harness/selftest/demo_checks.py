"""The harness's own 2-process script (gloo): a check that fails on rank 1 only, after its collectives, between
checks that pass, and one skipped; the checks after it run, in step, and their collectives still pair up.

Run by tests/harness/test_harness.py (under pytest, through selftest/demo_checks_suite.py). ``DEMO_FAIL=0`` makes
every check pass.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks, skip

FAIL = os.environ.get("DEMO_FAIL", "1") == "1"
dist.init_process_group("gloo")
RANK = dist.get_rank()


def world_sum(value: float) -> float:
    tensor = torch.tensor([value])
    dist.all_reduce(tensor)
    return tensor.item()


@check
def first_passes() -> None:
    expect(world_sum(1.0) == 2.0, "two ranks")


@check
def fails_on_rank_1() -> None:
    total = world_sum(RANK)
    expect(not (FAIL and RANK == 1), f"rank 1 disagrees: the sum is {total}")


@check
def raises_on_every_rank() -> None:
    world_sum(1.0)
    if FAIL:
        raise ValueError("not a number")


@check
def skipped_on_every_rank() -> None:
    world_sum(1.0)
    skip("a check that does not apply to this launch")


@check
def runs_after_the_failures() -> None:
    # Still in step: this all_reduce pairs with the peer's, and the ranks are where they should be.
    everyone: list = [None, None]
    dist.all_gather_object(everyone, ("after", RANK))
    expect(everyone == [("after", 0), ("after", 1)], f"out of step: {everyone}")


if __name__ == "__main__":
    run_checks(teardown=dist.destroy_process_group)
