"""A successful `accel launch` ends quietly: nothing of accel's or torch's on stderr at exit, and a
job run with PYTHONWARNINGS=error (warnings raised as errors) still succeeds. Lines two ranks print at
the same time reach the shared output whole.

The runner's exit path flushes the files a script left open by looking at every live object; it
must not run code of those objects (``isinstance`` reads ``obj.__class__``, and torch's deprecated
``torch.distributed.reduce_op`` warns on any attribute read).
"""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
def test_a_finished_two_process_job_exits_cleanly_under_warnings_as_errors(cli) -> None:
    result = cli.run(
        "launch",
        "--cpu",
        "-n",
        "2",
        "--scheduler-stepping",
        "per_optimizer_step",
        str(cli.scripts / "clean_finish.py"),
        env_extra={"PYTHONWARNINGS": "error"},
    )
    assert result.returncode == 0, cli.describe(result)
    lines = sorted(re.findall(r"^finished rank \d sum [\d.]+ stepping \w+ lr [\d.]+$", result.stdout, re.M))
    # The flag reached both workers: one scheduler step for the one optimizer step.
    assert lines == [f"finished rank {r} sum 2.0 stepping per_optimizer_step lr 0.05" for r in (0, 1)], result.stdout
    assert "Warning" not in result.stderr and "reduce_op" not in result.stderr, result.stderr
    assert result.stderr.strip() == "", result.stderr
    # Whole lines: under torchrun's `python -u` print wrote the text and the newline apart, and the two ranks' lines
    # were glued together mid-line (about 6% arrived intact); the runner makes the workers' output line-buffered.
    burst = [line for line in result.stdout.splitlines() if "burst" in line]
    broken = [line for line in burst if not re.fullmatch(r"burst [01] (\d+|end \d+)", line)]
    assert not broken, f"{len(broken)} of {len(burst)} lines broken: {broken[:5]}"
    for rank in (0, 1):
        count = int(re.search(rf"^burst {rank} end (\d+)$", result.stdout, re.M).group(1))
        assert sum(line.startswith(f"burst {rank} ") for line in burst) == count + 1
