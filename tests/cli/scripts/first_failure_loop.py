"""Launches rank1_dies.py ``runs`` times on 2 processes through ``accel_launch.launch`` (what `accel launch`
runs, in one process so torch is imported once) and prints, per run, the rank the failure names and its exit code."""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from accel_launch import JobFailedError, LaunchTarget, launch, resolve_plan

mode, how, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
plan = resolve_plan({"num_processes": 2, "use_cpu": True}, os.environ, {})
results = []
flags = tempfile.TemporaryDirectory(prefix="first-failure-")  # rank1_dies.py's `signal` peer waits for one per run
for run in range(runs):
    flag = Path(flags.name) / f"rank1-fails-{run}"
    target = LaunchTarget(str(Path(__file__).with_name("rank1_dies.py")), (mode, how, str(flag)))
    start = time.monotonic()
    try:
        code = launch(plan, target)
        results.append({"rank": None, "exit_code": code})
    except JobFailedError as failure:
        results.append({"rank": failure.root.rank, "exit_code": failure.exit_code, "text": str(failure)})
    results[-1]["seconds"] = round(time.monotonic() - start, 2)
flags.cleanup()
print(json.dumps(results))
