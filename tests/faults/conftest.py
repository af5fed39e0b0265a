"""What the fault tests share: one uninterrupted run of ``restartable_train.py`` on 2 CPU processes.

Every faulty run of that script (workers SIGKILLed, a node lost) must end with its final weights
and metrics; the run is made once per session for all modules that compare with it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from nodes import accel_command

RESTARTABLE_TRAIN = Path(__file__).resolve().parent / "restartable_train.py"


@pytest.fixture(scope="session")
def restartable_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted ``accel launch --cpu -n 2 restartable_train.py``: the end every faulty run must reach."""
    project = tmp_path_factory.mktemp("faults") / "reference"
    project.mkdir()
    command = [*accel_command(), "launch", "--cpu", "-n", "2", str(RESTARTABLE_TRAIN), str(project)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCEL_CHECKPOINT_FSYNC": "0", "FAULT_PLAN": "{}"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return project
