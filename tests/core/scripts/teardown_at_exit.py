"""A script that never calls free_memory(): its strategy is torn down once at exit, before the process groups go.

Joins a gloo group of one first, so the process state registers its exit hook that destroys the groups (as in
every multi-process run); an exit hook registered before the Accelerator is made must run after the teardown.
Writes what the teardown saw to <out>: the number of calls, and whether the process group was still there.

Run: python tests/core/scripts/teardown_at_exit.py <out>
"""

from __future__ import annotations

import atexit
import socket
import sys

import torch
import torch.distributed as dist

from accel_core import Accelerator
from accel_core.strategies import Strategy

OUT = sys.argv[1]
seen: list[bool] = []


class RecordingStrategy(Strategy):
    """The base strategy (single process), recording its teardown: the real lifecycle, observed."""

    name = "recording"

    def teardown(self) -> None:
        seen.append(dist.is_initialized())


def record() -> None:
    with open(OUT, "w") as out:
        out.write(f"teardowns={len(seen)} group_alive={seen}\n")


atexit.register(record)  # registered before the Accelerator: runs after its teardown hook
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
accelerator = Accelerator(strategy=RecordingStrategy())
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
accelerator.backward(model(torch.ones(1, 2)).sum())
optimizer.step()
accelerator.end_training()  # closes the trackers; the model stays usable, so no teardown yet
assert not seen, "end_training() tore the strategy down"
print("script done")
