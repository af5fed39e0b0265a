"""Run under torchrun's static rendezvous with ``--max-restarts 1``: rank 1 SIGKILLs itself in the first attempt.

The static rendezvous (what several machines use by default) keeps one store for every attempt. The
restarted workers must set up the default group and a gloo group (as accel-checkpoint's coordinator
group is made) from keys of their own attempt, then agree on a value. Each rank prints one line
``ok attempt=<n> rank=<r> sum=<s>``.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist

from accel_core import Accelerator

accelerator = Accelerator(cpu=True)
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
group = dist.new_group(backend="gloo")
total = torch.tensor([float(accelerator.process_index + 1)])
dist.all_reduce(total, group=group)
if attempt == 0 and accelerator.process_index == 1:
    os.kill(os.getpid(), signal.SIGKILL)
accelerator.wait_for_everyone()
print(f"ok attempt={attempt} rank={accelerator.process_index} sum={total.item():g}", flush=True)
