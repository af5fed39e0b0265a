"""Run with `accel launch -m probe_pkg.probe <out_dir> ...`: each rank joins the gloo group and writes what it saw.

With PROBE_FAIL_ONCE=<marker> the first attempt fails (rank 1 raises before importing torch, rank 0
waits to be stopped), so a job launched with --max-restarts 1 passes on its second attempt.
"""

import json
import os
import sys
import time
from pathlib import Path

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
fail_once = os.environ.get("PROBE_FAIL_ONCE")
if fail_once and not os.path.exists(f"{fail_once}.rank{os.environ['RANK']}"):
    open(f"{fail_once}.rank{os.environ['RANK']}", "w").close()
    if os.environ["RANK"] == "1":
        raise RuntimeError(f"attempt {attempt} fails on purpose")
    time.sleep(60)

# Imported only now: rank 1 of the failing attempt must fail before importing torch.
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from accel_core.state import PartialState  # noqa: E402

state = PartialState()
total = torch.tensor([float(state.process_index + 1)])
dist.all_reduce(total)
names = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "OMP_NUM_THREADS",
    "FOO",
    "FROM_CONFIG",
    "ACCEL_MIXED_PRECISION",
    "ACCEL_GRADIENT_ACCUMULATION_STEPS",
    "ACCEL_USE_CPU",
    "ACCEL_DYNAMO_BACKEND",
    "ACCEL_DEBUG_MODE",
    "ACCEL_TOYBACKEND_LEVEL",
    "ACCEL_TOYBACKEND_FAST",
]
report = {
    "rank": state.process_index,
    "world": state.num_processes,
    "backend": state.backend,
    "device": str(state.device),
    "sum": total.item(),
    "attempt": attempt,
    "argv": sys.argv[1:],
    "name": __name__,
    "env": {name: os.environ.get(name) for name in names},
}
Path(sys.argv[1], f"rank{state.process_index}.json").write_text(json.dumps(report))
state.destroy_process_group()
