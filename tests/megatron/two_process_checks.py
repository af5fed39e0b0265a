"""The 2-process torchrun launch of the Megatron tests: pp_checks.py's checks, then tp_checks.py's, then
dummy_scheduler_checks.py's.

    PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/megatron/two_process_checks.py <tmp_dir>

One launch instead of three: each start costs a torchrun agent and two processes importing torch and Megatron-core,
more than most of these checks. The order follows Megatron's parallel groups, which one process keeps until they are
destroyed: pp_checks.py destroys its groups after each check; tp_checks.py ends on TP=1 x DP=2 groups, which
dummy_scheduler_checks.py (TP=1 on 2 processes) adopts. pp_checks.py's 4-process check is skipped here; its own
4-process launch runs it. Each check is one test of test_megatron_runs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import importlib

from checklist import run_checks

# Importing a script registers its checks; they run in that order (test_megatron_runs.py expects it).
for script in ("pp_checks", "tp_checks", "dummy_scheduler_checks"):
    importlib.import_module(script)

if __name__ == "__main__":
    run_checks()
