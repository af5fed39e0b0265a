"""Two stalls in one job (each a launch of its own cost a torch start-up and its own wait).

Rank 1 reaches a barrier 1 s late (under the stall threshold the test sets: no report), then a gather ``argv[2]``
seconds late: the stall report names it, and the gather then completes on both ranks (the report does not stop the
job). Then rank 1 hangs outside any collective while rank 0 waits in a barrier: reported again, and the collective
timeout ends the job. Each rank writes its pid to ``<argv[1]><RANK>`` first.
"""

import os
import sys
import time
from pathlib import Path

import torch

from accel_core import Accelerator

accelerator = Accelerator(cpu=True)
Path(sys.argv[1] + str(accelerator.process_index)).write_text(str(os.getpid()))
late = float(sys.argv[2])
accelerator.wait_for_everyone()  # both started: the next barrier's wait is rank 1's second only
if accelerator.process_index == 1:
    time.sleep(1.0)
accelerator.wait_for_everyone()  # LINE: late barrier
if accelerator.process_index == 1:
    time.sleep(late)  # LINE: rank 1 late
gathered = accelerator.gather(torch.tensor([accelerator.process_index]))  # LINE: the gather
print(f"rank {accelerator.process_index} finished the gather with {gathered.tolist()}", flush=True)
if accelerator.process_index == 1:
    time.sleep(300)  # LINE: rank 1 stuck
accelerator.wait_for_everyone()  # LINE: last barrier
print("rank 0 passed a barrier rank 1 never reached", flush=True)
