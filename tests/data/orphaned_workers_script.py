"""Starts a loader's two workers, then SIGKILLs itself while they are in ``worker_init_fn``.

argv: the folder where each worker writes a file named by its pid; "prepared" or "raw" (torch's own loader).
"""

import os
import signal
import sys
import threading
import time

from torch.utils.data import DataLoader

from accel_data import prepare_data_loader

folder, kind = sys.argv[1], sys.argv[2]


def announce_then_linger(worker_id: int) -> None:
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(1.5)  # the training process dies meanwhile


loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, worker_init_fn=announce_then_linger)
if kind == "prepared":
    loader = prepare_data_loader(loader, num_processes=1, process_index=0)
# The first batch starts the workers (a prepared loader opens torch's iterator lazily); wait for it elsewhere.
threading.Thread(target=lambda: next(iter(loader)), daemon=True).start()
deadline = time.monotonic() + 60
while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)
