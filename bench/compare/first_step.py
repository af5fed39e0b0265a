"""Launch-to-first-step: started by a launcher (accel launch, accelerate launch, fabric run, torchrun); process 0
writes the seconds from BENCH_T0 (the launcher's start, set by run.py) to the end of the first training step.

    BENCH_T0=$(date +%s.%N) <launcher> first_step.py <framework> <out.json>
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from frameworks import make


def main() -> None:
    framework, out = sys.argv[1], sys.argv[2]
    harness = make(framework, grad_accum=1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, _ = harness.prepare(model, optimizer)
    harness.train_step(model, optimizer, None, torch.randn(8, 64), torch.randn(8, 64))
    elapsed = time.time() - float(os.environ["BENCH_T0"])
    if harness.rank == 0:
        with open(out, "w") as f:
            json.dump({"first_step_s": elapsed}, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
