"""Fixtures of the cluster-engine tests: one SLURM cluster for the session, and the reference run every engine's
training must equal.

The engines are real: ``slurmctld`` + two ``slurmd`` (tests/harness/slurm.py), OpenMPI's ``mpirun``, Ray Train.
tests/clusters/setup.sh installs them (CI runs it); a test whose engine is missing is skipped with that reason.
The test modules import ``engine_runs`` (this folder, put on the path here).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from checkrun import worker_env
from nodes import accel_command
from slurm import SlurmCluster, slurm_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_runs import TRAIN, TrainingRun, run_job  # this folder, on the path just above


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> TrainingRun:
    """``accel launch --cpu -n 2 cluster_train.py``: the run every engine must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    done = run_job([*accel_command(), "launch", "--cpu", "-n", "2", str(TRAIN), str(out)], worker_env())
    reference = TrainingRun.read(out, done.stdout + done.stderr)
    assert all(r["launcher"] == "torchrun" for r in reference.reports), reference.reports
    return reference


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One two-node SLURM cluster (two network namespaces) for every SLURM test of the session."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
