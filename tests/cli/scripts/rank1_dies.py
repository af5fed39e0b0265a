"""Two ranks, no torch: rank 1 dies (``kill``: SIGKILL, as the out-of-memory killer does; ``exit``: sys.exit(3);
``finish``: its script ends cleanly, too early); rank 0 sleeps until the launcher stops it, or (``collective``) waits
in a gloo barrier, which fails when rank 1 is gone."""

import os
import signal
import sys
import time

mode, how = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sleep"
if how == "collective":
    import torch.distributed as dist

    dist.init_process_group("gloo")
if os.environ["RANK"] == "1":
    time.sleep(0.3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0 if mode == "finish" else 3)
if how == "collective":
    dist.barrier()  # raises "Connection closed by peer" once rank 1 is gone
time.sleep(60)
print("rank 0 was not stopped", flush=True)
