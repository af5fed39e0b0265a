"""The habit the stall report must name: `save_state` under `if accelerator.is_main_process:`. Rank 0 saves (and
waits in save_state for rank 1's part); rank 1 goes on with other work (a long sleep here, outside any collective)."""

import sys
import time

import torch

from accel_core import Accelerator

accelerator = Accelerator(cpu=True, project_dir=sys.argv[1])
model = accelerator.prepare(torch.nn.Linear(4, 2))
if accelerator.is_main_process:
    accelerator.save_state(sys.argv[1] + "/checkpoint")  # LINE: the save
else:
    time.sleep(300)  # LINE: rank 1 elsewhere
