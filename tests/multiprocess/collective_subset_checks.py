"""A collective on rank 0 only, under ACCEL_DEBUG_MODE=1 (2 processes, gloo): torch's TORCH_DISTRIBUTED_DEBUG=DETAIL
checks report the missing rank within seconds instead of hanging.

Run: ACCEL_DEBUG_MODE=1 PYTHONPATH=tests/harness torchrun --nproc_per_node 2 \
     tests/multiprocess/collective_subset_checks.py <folder>
Each ``@check`` is one test of tests/core/test_collective_checks.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks

from accel_core import Accelerator, InitProcessGroupKwargs

FOLDER = Path(sys.argv[1])  # where the ranks meet before the group, and rank 0 says it saw the report


def meet_before_the_group() -> None:
    """Waits (through files, there is no group yet) until both ranks have imported everything. The group's timeout
    is also how long gloo waits for the other rank to connect: a rank slower to import torch on a loaded machine
    must not use it up, so that it can be short."""
    (FOLDER / f"imported.{os.environ['RANK']}").touch()
    deadline = time.monotonic() + 120
    while not all((FOLDER / f"imported.{r}").exists() for r in range(2)):
        if time.monotonic() > deadline:
            raise RuntimeError("the other rank did not start within 120 s")
        time.sleep(0.01)


meet_before_the_group()
# A short collective timeout, so torch's check names the missing rank within seconds: it is the time the check
# waits (10 s before the ranks met first).
acc = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=5))])
rank = acc.process_index


@check
def a_ddp_model_trains_in_debug_mode() -> None:
    """DDP over gloo under DETAIL: torch's DDP logger crashed every process (SIGSEGV) on the checking wrapper
    (accel_core.strategies.ddp.group_ddp_can_log); the model trains, and the world group keeps its checks."""
    torch.manual_seed(0)
    model = acc.prepare(torch.nn.Linear(4, 2))
    expect(type(model).__name__ == "DistributedDataParallel", f"prepared as {type(model).__name__}")
    loss = model(torch.full((3, 4), float(rank + 1))).sum()
    acc.backward(loss)
    grads = [p.grad.clone() for p in model.parameters()]
    both = acc.gather(torch.stack([g.sum() for g in grads]))  # through the checked world group
    expect(torch.allclose(both[:2], both[2:]), f"gradients differ between ranks after the all-reduce: {both}")
    expect("Wrapper" in type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__, "world group unwrapped")


@check
def a_collective_on_one_rank_is_reported() -> None:
    """ACCEL_DEBUG_MODE=1 turns on TORCH_DISTRIBUTED_DEBUG=DETAIL: a collective on rank 0 only is reported."""
    expect(dist.get_debug_level() == dist.DebugLevel.DETAIL, f"debug level {dist.get_debug_level()}")
    if rank == 0:
        start = time.monotonic()
        try:
            acc.gather(torch.ones(2))
        except RuntimeError as error:
            took = time.monotonic() - start
            expect("Ranks 1 failed to pass monitoredBarrier" in str(error), f"torch's message: {error}")
            expect(took < 30, f"reported after {took:.0f}s")
            print(f"ok a gather on rank 0 only, reported after {took:.1f}s: {error}", flush=True)
            (FOLDER / "reported").touch()
        else:
            raise AssertionError("a gather on rank 0 only returned")
    else:
        # Never joins; rank 0 must not wait for it past the timeout. It stays up until rank 0 has seen
        # the report (a file, not a collective), so that rank 0 sees a missing rank, not an exited one.
        reported = FOLDER / "reported"
        deadline = time.monotonic() + 40
        while not reported.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


if __name__ == "__main__":
    run_checks()  # no teardown: the group is left with rank 0's unmatched gather
