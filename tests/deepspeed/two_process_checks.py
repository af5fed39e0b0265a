"""The 2-process torchrun launch of the DeepSpeed tests: zero_checks.py's checks, reshard_checks.py's, then
tests/bench/zero3_step_checks.py's (bench/zero3_step.py at a tiny size, read by tests/bench/test_zero3_step.py).

    PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/deepspeed/two_process_checks.py <tmp_dir> &
    PYTHONPATH=tests/harness python tests/deepspeed/one_process_checks.py <tmp_dir>

One launch instead of two: each start of a process costs its torch and DeepSpeed imports and a process group, a
second torchrun agent and its two workers cost more than the checks of one ZeRO stage. The ZeRO checks run first,
while the 1-process launch (one_process_checks.py, started at the same time) runs its own first; then both reach
reshard_checks.py's checks and load each other's checkpoints (its waits allow for the other side's earlier checks).
The bench step comes last: it wraps DeepSpeed's collectives to count them. Each check is one test of
test_deepspeed_runs.py or test_zero3_step.py (the harness: tests/harness/checklist.py; the launch:
tests/harness/deepspeed_launch.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path

import torch.distributed as dist
from checklist import run_checks

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # zero3_step_checks.py
# Importing a script registers its checks; they run in that order (tests/harness/deepspeed_launch.py expects it).
zero_checks, reshard_checks, _ = (
    importlib.import_module(name) for name in ("zero_checks", "reshard_checks", "zero3_step_checks")
)


def print_figures() -> None:
    """Both scripts' figures (their names differ) on one line, once every check has run."""
    if dist.get_rank() == 0:
        print("FIGURES " + json.dumps({**zero_checks.FIGURES, **reshard_checks.FIGURES}), flush=True)


if __name__ == "__main__":
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    run_checks(teardown=print_figures)
