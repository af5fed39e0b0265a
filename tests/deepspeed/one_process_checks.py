"""The plain `python` start of the DeepSpeed tests: single_process_checks.py's checks, then reshard_checks.py's.

    PYTHONPATH=tests/harness python tests/deepspeed/one_process_checks.py <tmp_dir>

Started together with two_process_checks.py (see there): one process and one DeepSpeed import instead of two. The
single-process checks run first, so ``plain_python_start`` still sees the process's first Accelerator start its
group of one; then reshard_checks.py's checks exchange checkpoints with the 2-process launch.
Each check is one test of test_deepspeed_runs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import importlib
import json
import logging

from checklist import run_checks

# Importing a script registers its checks; they run in that order (test_deepspeed_runs.py expects it).
single_process_checks, reshard_checks = (
    importlib.import_module(name) for name in ("single_process_checks", "reshard_checks")
)


def print_figures() -> None:
    """Both scripts' figures (their names differ) on one line, once every check has run."""
    print("FIGURES " + json.dumps({**single_process_checks.FIGURES, **reshard_checks.FIGURES}), flush=True)


if __name__ == "__main__":
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    run_checks(teardown=print_figures)
