"""Rank 1 stops itself with SIGSTOP inside a training step; rank 0 goes on into DDP's gradient all-reduce in backward.

Usage: ``stall_in_backward.py <folder> <step>``. Each rank writes its pid to ``<folder>/pid<rank>``; rank 1 writes the
time to ``<folder>/stopped_at`` and SIGSTOPs itself in the forward of step ``<step>`` (a forward pre-hook, so the
stop is inside the step, before its backward). Rank 0 then waits in the all-reduce that torch's DDP starts from
inside ``accelerator.backward`` (not one of accel's collectives) until someone sends rank 1 SIGCONT; then both
finish their steps and print ``rank R done``.
"""

import os
import signal
import sys
import time
from pathlib import Path

import torch

from accel_core import Accelerator

folder, stop_at = Path(sys.argv[1]), int(sys.argv[2])
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
(folder / f"pid{rank}").write_text(str(os.getpid()))
step = 0


def stop_inside_the_step(module: torch.nn.Module, inputs: object) -> None:
    if rank == 1 and step == stop_at:
        (folder / "stopped_at").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)  # LINE: rank 1 stops


model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
model.register_forward_pre_hook(stop_inside_the_step)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for step in range(stop_at + 3):  # noqa: B007 - the hook reads it
    loss = model(torch.full((2, 4), float(rank + 1))).sum()
    accelerator.backward(loss)  # LINE: backward
    optimizer.step()
    optimizer.zero_grad()
print(f"rank {rank} done {step + 1} steps", flush=True)
