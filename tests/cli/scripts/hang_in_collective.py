"""Rank 1 hangs (never reaches the barrier) while rank 0 waits in it: the collective timeout must end the job.
Each rank writes its pid to <argv[1]><RANK> first."""

import os
import sys
import time
from pathlib import Path

from accel_core import Accelerator

accelerator = Accelerator(cpu=True)
Path(sys.argv[1] + str(accelerator.process_index)).write_text(str(os.getpid()))
accelerator.wait_for_everyone()  # both here: the group works
if accelerator.process_index == 1:
    time.sleep(300)  # LINE: rank 1 stuck
accelerator.wait_for_everyone()  # LINE: second barrier
print("rank 0 passed a barrier rank 1 never reached", flush=True)
