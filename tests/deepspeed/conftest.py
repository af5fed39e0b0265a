"""The DeepSpeed tests' session fixture: DeepSpeed's CPU ops built (or found) once, before any timed run.

DeepSpeed JIT-compiles two small C++ ops (its shared-memory allreduce, its CPU Adam) into TORCH_EXTENSIONS_DIR the
first time; CI keeps that folder between runs, so the build happens once per checkout path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from checkrun import worker_env

REPO = Path(__file__).resolve().parents[2]

_BUILD_OPS = """
from accel_deepspeed._deepspeed import import_deepspeed
from accel_deepspeed.ops import CPU_ADAM, SHM_COMM, load_op
import_deepspeed()
for name in (SHM_COMM, CPU_ADAM):
    load_op(name)  # accel's build: announced, and safe from a lock left by a killed build
print("OPS READY")
"""


@pytest.fixture(scope="session")
def deepspeed_ops() -> None:
    """Compiles (or finds in TORCH_EXTENSIONS_DIR) DeepSpeed's CPU ops before any timed run."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", _BUILD_OPS],
            env=worker_env({"DS_ACCELERATOR": "cpu"}),
            capture_output=True,
            text=True,
            timeout=1200,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("Compiling DeepSpeed's CPU ops took over 20 minutes")
    assert "OPS READY" in result.stdout, result.stderr[-4000:]
