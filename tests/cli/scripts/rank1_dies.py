"""Two ranks, no torch: rank 1 dies (``kill``: SIGKILL, as the out-of-memory killer does; ``exit``: sys.exit(3);
``finish``: its script ends cleanly, too early); rank 0 sleeps until the launcher stops it, or (``collective``) waits
in a gloo barrier, which fails when rank 1 is gone, or (``signal``, with a flag file's path as third argument) dies by
SIGKILL itself the moment rank 1 has ended, as a native abort that follows a peer's lost connection would: later than
the cause, and before the agent's next look.

Rank 1 dies 0.3 s after joining the group (``collective``: rank 0 is in the barrier by then), else 0.05 s after its
start: rank 0 only has to have been started, the launcher stops it wherever it is (0.3 s there cost the 20-run loops
0.3 to 1 s a run on 2 busy cores, rank 0's whole start-up included)."""

import os
import signal
import sys
import time

mode, how = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "sleep"
if how == "collective":
    import torch.distributed as dist

    dist.init_process_group("gloo")
if os.environ["RANK"] == "1":
    time.sleep(0.05 if how == "sleep" else 0.3)  # `signal`: rank 0 is waiting for the flag by then
    if how == "signal":
        with open(sys.argv[3] + ".part", "w") as flag:
            flag.write(str(os.getpid()))
        os.rename(sys.argv[3] + ".part", sys.argv[3])  # rank 0 reads a whole pid
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0 if mode == "finish" else 3)
if how == "collective":
    dist.barrier()  # raises "Connection closed by peer" once rank 1 is gone
if how == "signal":
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.001)
    stat = f"/proc/{int(open(sys.argv[3]).read())}/stat"  # noqa: SIM115 - read once
    while os.path.exists(stat) and open(stat).read().rsplit(")", 1)[1].split()[0] != "Z":  # noqa: SIM115
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
print("rank 0 was not stopped", flush=True)
