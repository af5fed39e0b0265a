"""bench/zero3_step.py at a tiny size (2 blocks of width 32, 2 rounds of 2 micro-steps) on 2 processes, as one check.

It runs as the last check of the DeepSpeed tests' 2-process launch (tests/deepspeed/two_process_checks.py, started by
tests/harness/deepspeed_launch.py): the launch has imported torch and DeepSpeed already, and its gloo group serves the
benchmark's two engines as torchrun's would. Process 0 writes what the benchmark printed to ``REPORT`` in the launch's
folder, for tests/bench/test_zero3_step.py to read. By hand:

    PYTHONPATH=tests/harness DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/bench/zero3_step_checks.py <tmp_dir>
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from checklist import check, run_checks

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = ["--rounds", "2", "--steps", "2", "--dim", "32", "--depth", "2"]
REPORT = "zero3_step.txt"  # tests/bench/test_zero3_step.py reads it


@check
def zero3_step_at_a_tiny_size() -> None:
    import torch.distributed as dist

    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import zero3_step  # pyright: ignore[reportMissingImports] - bench/ on sys.path

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        zero3_step.main(TINY)
    if dist.get_rank() == 0:
        (Path(sys.argv[1]) / REPORT).write_text(printed.getvalue(), encoding="utf-8")
        print(printed.getvalue(), flush=True)


if __name__ == "__main__":
    run_checks()
