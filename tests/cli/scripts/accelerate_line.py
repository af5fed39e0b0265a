"""What an Accelerate launch line gave this worker: the Accelerator's settings and the threads, as one JSON line."""

import json
import os
import sys

import torch

from accel import Accelerator

accelerator = Accelerator()
report = {
    "rank": accelerator.process_index,
    "processes": accelerator.num_processes,
    "distributed_type": str(accelerator.distributed_type),
    "mixed_precision": accelerator.mixed_precision,
    "omp": os.environ.get("OMP_NUM_THREADS"),
    "threads": torch.get_num_threads(),
    "compile": accelerator.dynamo_plugin.to_kwargs() if accelerator.dynamo_plugin else None,
}
# One write per line: workers share the pipe, and `python -u` would write print's newline separately.
sys.stdout.write("REPORT " + json.dumps(report) + "\n")
accelerator.end_training()
