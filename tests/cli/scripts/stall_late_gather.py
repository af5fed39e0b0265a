"""Rank 0 gathers while rank 1 sleeps before it (a rank arriving late), then both finish normally.

A barrier rank 1 reaches 1 s late comes first (under the stall threshold the test sets: no report).
The stall report must name rank 1, where it sleeps and its last collective, without ending the job.
"""

import sys
import time

import torch

from accel_core import Accelerator

accelerator = Accelerator(cpu=True)
late = float(sys.argv[1])
if accelerator.process_index == 1:
    time.sleep(1.0)
accelerator.wait_for_everyone()  # LINE: first barrier
if accelerator.process_index == 1:
    time.sleep(late)  # LINE: rank 1 late
gathered = accelerator.gather(torch.tensor([accelerator.process_index]))  # LINE: the gather
print(f"rank {accelerator.process_index} finished with {gathered.tolist()}", flush=True)
