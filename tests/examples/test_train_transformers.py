"""examples/train_transformers.py, run as a user runs it: a tiny offline BERT trained on 2 CPU processes.

The same script with `accel` replaced by `accelerate` reached 0.70 eval accuracy on Accelerate 1.15
(2 processes under torchrun, 2026-12-01); the check here is that it learns (> 0.6, chance is 0.5),
logs through get_logger as documented, and counts each of the 301 evaluation samples once.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Looked up, not imported: importing transformers at collection would cost every run of the suite seconds.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

REPO = Path(__file__).resolve().parents[2]
ACCEL = Path(sys.executable).parent / "accel"


@pytest.mark.slow
def test_tiny_bert_trains_on_two_processes():
    command = [str(ACCEL), "launch", "--cpu", "-n", "2", "examples/train_transformers.py", "--epochs", "4"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    log = result.stderr + result.stdout
    assert len(re.findall(r"2 process\(es\), model bert", log)) == 1, "main-process-only records print once"
    assert len(re.findall(r"batch size 32: 32 batches per epoch on this process", log)) == 2, (
        "in_order records print on each rank"
    )
    epochs = re.findall(r"epoch (\d): train loss [\d.]+ \| eval accuracy ([\d.]+) on (\d+) samples", log)
    assert [e[0] for e in epochs] == ["0", "1", "2", "3"], log[-3000:]
    assert {int(e[2]) for e in epochs} == {301}, "gather_for_metrics must count each evaluation sample once"
    assert float(epochs[-1][1]) > 0.6, epochs
