"""Two processes (gloo, CPU): exact resume, failures shared by all processes, sharded (DCP) state."""

from __future__ import annotations

from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "mp_checkpoint.py"


def test_two_processes_resume_exactly_and_share_failures(tmp_path, torchrun):
    first = torchrun(SCRIPT, "full", str(tmp_path), timeout=300)
    assert first.stdout.count("full run OK") == 2
    second = torchrun(SCRIPT, "resume", str(tmp_path), timeout=300)
    for check in ("exact resume OK", "failure on one process fails all OK", "sharded checkpoints OK"):
        assert second.stdout.count(check) == 2, second.stdout
