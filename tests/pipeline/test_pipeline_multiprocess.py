"""Pipeline parallelism for real: one 4-process launch (gloo, CPU) of pipeline_checks.py through PP2 x DP2
(GPipe; 1F1B with accumulation), PP2 x TP2, PP2 x FSDP2 with interleaved 1F1B, PP4, a checkpoint
round trip (and one with 2 stages per rank), a meta-device model (see that script's docstring for what each
layout checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

LAYOUTS = ("PP2xDP2-gpipe", "PP2xDP2-1f1b-accumulate2", "PP2xTP2-1f1b", "PP2xFSDP2-interleaved", "PP4-1f1b")


@pytest.mark.slow
def test_pipeline_layouts_match_one_process_on_four_processes(torchrun, tmp_path):
    result = torchrun(HERE / "pipeline_checks.py", str(tmp_path), nproc=4, timeout=1200)
    assert all(f"PIPELINE CHECKS PASSED {rank}" in result.stdout for rank in range(4)), result.stdout[-3000:]
    for layout in LAYOUTS:
        assert f"LAYOUT {layout}:" in result.stdout, result.stdout[-3000:]
    assert result.stdout.count("TRAINING FORWARD REFUSED ON EVERY RANK") == len(LAYOUTS)
    assert "CHECKPOINT PP2xDP2 -> same layout exact" in result.stdout
    assert "INTERLEAVED CHECKPOINT: save, 2 steps, load, the same 2 steps exactly" in result.stdout
    assert "META-DEVICE PIPELINE" in result.stdout
