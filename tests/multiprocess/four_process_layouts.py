"""The 4-process launch of the layout tests: tests/parallelism/mesh_checks.py's checks, then
tests/pipeline/pipeline_checks.py's, in one set of processes.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 4 tests/multiprocess/four_process_layouts.py <folder>

One launch instead of two: each costs four processes importing torch and accel, a process group, and the first use
of DTensor, FSDP and DCP (seconds of every first check). Both scripts take ``<folder>`` (their files have other
names) and build a fresh Accelerator for each check. test_mesh_multiprocess.py and test_pipeline_multiprocess.py
share the launch (tests/conftest.py: the session fixture four_process_layouts), each reporting its own script's checks.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch.distributed as dist
from checklist import run_checks

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "parallelism"), str(TESTS / "pipeline")]  # their helpers: tinyllama.py, pipemodel.py

# Importing a script registers its checks; they run in that order (the test modules expect it).
for script in ("mesh_checks", "pipeline_checks"):
    importlib.import_module(script)

if __name__ == "__main__":
    run_checks(teardown=dist.destroy_process_group)
