"""Launch-to-first-step: started by a launcher (accel launch, accelerate launch, fabric run, torchrun); process 0
writes the seconds from BENCH_T0 (the launcher's start, set by run.py) to the end of the first training step, and
how long `import torch` and then the framework's own import took in this process (the import-time row: measured
inside one fresh process, free of the interpreter's start-up noise).

    BENCH_T0=$(date +%s.%N) <launcher> first_step.py <framework> <out.json>
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

START = time.perf_counter()
import torch  # noqa: E402 - timed: the framework's import is measured on top of it

TORCH_S = time.perf_counter() - START

# What a user's script imports, per framework (accel resolves `Accelerator` lazily: the attribute is part of it).
IMPORTS = {
    "raw": ("torch.nn.parallel", "DistributedDataParallel"),
    "accel": ("accel", "Accelerator"),
    "accelerate": ("accelerate", "Accelerator"),
    "fabric": ("lightning_fabric", "Fabric"),
}


def import_framework(framework: str) -> float:
    module, name = IMPORTS[framework]
    start = time.perf_counter()
    getattr(importlib.import_module(module), name)
    return time.perf_counter() - start


def main() -> None:
    framework, out = sys.argv[1], sys.argv[2]
    over_torch_s = import_framework(framework)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from frameworks import make

    harness = make(framework, grad_accum=1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, _ = harness.prepare(model, optimizer)
    harness.train_step(model, optimizer, None, torch.randn(8, 64), torch.randn(8, 64))
    elapsed = time.time() - float(os.environ["BENCH_T0"])
    if harness.rank == 0:
        with open(out, "w") as f:
            json.dump({"first_step_s": elapsed, "torch_s": TORCH_S, "over_torch_s": over_torch_s}, f)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
