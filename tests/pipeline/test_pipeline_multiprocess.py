"""Pipeline parallelism for real: one 4-process launch (gloo, CPU; shared with the mesh tests, whose checks run first:
tests/multiprocess/four_process_layouts.py) of pipeline_checks.py through PP2 x DP2
(GPipe; 1F1B with accumulation), PP2 x TP2, PP2 x FSDP2 with interleaved 1F1B, PP4, a checkpoint
round trip (and one with 2 stages per rank), a meta-device model (see that script's docstring for what each
layout checks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in

HERE = Path(__file__).resolve().parent

LAYOUTS = ("PP2xDP2-gpipe", "PP2xDP2-1f1b-accumulate2", "PP2xTP2-1f1b", "PP2xFSDP2-interleaved", "PP4-1f1b")


# One 4-process launch runs tests/parallelism/mesh_checks.py's checks, then this script's (tests/conftest.py:
# four_process_layouts).
SCRIPT = HERE / "pipeline_checks.py"


@pytest.fixture(scope="module")
def pipeline_run(four_process_layouts: tuple[CheckRun, Path]) -> CheckRun:
    return four_process_layouts[0]


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_pipeline_layouts_match_one_process_on_four_processes(pipeline_run: CheckRun, name: str) -> None:
    pipeline_run.assert_passed(name)


def test_rank_0_reports_every_layout(pipeline_run: CheckRun) -> None:
    stdout = pipeline_run.stdout
    for layout in LAYOUTS:
        assert f"LAYOUT {layout}:" in stdout, stdout[-3000:]
    assert stdout.count("TRAINING FORWARD REFUSED ON EVERY RANK") == len(LAYOUTS)
    assert "CHECKPOINT PP2xDP2 -> same layout exact" in stdout
    assert "INTERLEAVED CHECKPOINT: save, 2 steps, load, the same 2 steps exactly" in stdout
    assert "META-DEVICE PIPELINE" in stdout
