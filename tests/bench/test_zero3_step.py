"""bench/zero3_step.py at a tiny size (2 blocks of width 32, 2 rounds of 2 micro-steps), 2 processes: it reports
both columns, accel's ZeRO-3 engine config is the one DeepSpeed is given by hand (the raw column of the benchmark
table), and after the same steps the two engines hold the same parameters bit for bit."""

from __future__ import annotations

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "zero3_step.py"


def test_zero3_step_reports_accel_and_deepspeed_used_directly(torchrun) -> None:
    # The first run in a checkout compiles DeepSpeed's CPU communication op (minutes on 2 loaded cores), announced
    # by accel; later runs load it from TORCH_EXTENSIONS_DIR in a second.
    done = torchrun(SCRIPT, "--rounds", "2", "--steps", "2", "--dim", "32", "--depth", "2", timeout=900)
    out = done.stdout
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
