"""The 2-process torchrun launch of train_checks.py's checks, then tests/bench/fsdp2_clip_checks.py's.

    PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/fsdp/two_process_checks.py

One launch instead of two: each start of a process costs its torch import and a process group, which is more than
the clip checks themselves. The clip checks come last (their sharded model is built on their first use), so the
training checks run as in a launch of their own. Each check is one test of test_fsdp_multiprocess.py or
tests/bench/test_fsdp2_clip.py (the harness: tests/harness/checklist.py; the launch: tests/conftest.py's
``fsdp_two_process_checks``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from checklist import run_checks

sys.path.append(str(Path(__file__).resolve().parents[1] / "bench"))  # fsdp2_clip_checks.py
# Importing a script registers its checks; they run in that order (tests/conftest.py expects it).
for name in ("train_checks", "fsdp2_clip_checks"):
    importlib.import_module(name)

if __name__ == "__main__":
    run_checks()
