"""bench/zero3_step.py at a tiny size (2 blocks of width 32, 2 rounds of 2 micro-steps), 2 processes: it reports
both columns, accel's ZeRO-3 engine config is the one DeepSpeed is given by hand (the raw column of the benchmark
table), and after the same steps the two engines hold the same parameters bit for bit.

The benchmark runs as the last check of the DeepSpeed tests' 2-process launch (tests/bench/zero3_step_checks.py, in
the session's launch of tests/harness/deepspeed_launch.py): one start of torch and DeepSpeed serves both folders."""

from __future__ import annotations

import re

import pytest
from deepspeed_launch import DeepSpeedRuns

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

CHECK = "zero3_step_at_a_tiny_size"  # tests/bench/zero3_step_checks.py
REPORT = "zero3_step.txt"  # what the benchmark printed, written there by process 0


def test_zero3_step_reports_accel_and_deepspeed_used_directly(deepspeed_runs: DeepSpeedRuns) -> None:
    deepspeed_runs.runs[2].assert_passed(CHECK)  # the benchmark ran to its end on both processes
    out = (deepspeed_runs.folder / REPORT).read_text(encoding="utf-8")
    assert "configs: identical" in out, out
    counts = {}
    for name in ("accel", "raw"):
        line = re.search(rf"^{name}\s+per optimizer step: (.*); aten ops (\d+); Python calls (\d+)$", out, re.M)
        assert line is not None, out
        counts[name] = line.group(1)
        assert re.search(rf"^{name}\s+micro-step: wall +[\d.]+ ms .*CPU +[\d.]+ ms", out, re.M), out
    assert "reduce_scatter_tensor" in counts["raw"] and "all_gather_into_tensor" in counts["raw"], counts
    assert counts["accel"] == counts["raw"], counts  # accel adds no collective to DeepSpeed's own
    assert re.search(r"^accel / raw: wall [\d.]+, CPU [\d.]+ ", out, re.M), out
    assert re.search(r"^accel / raw per round: wall [\d.]+ \(.*\), CPU [\d.]+ ", out, re.M), out
    assert "parameters after 14 micro-steps: identical" in out, out
