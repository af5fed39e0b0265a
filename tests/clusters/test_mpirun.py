"""``mpirun -np 2 python cluster_train.py`` (OpenMPI): each rank joins with a plain ``Accelerator()`` from
OpenMPI's ``OMPI_COMM_WORLD_*`` variables, and trains as ``accel launch --cpu -n 2`` does, bit for bit.

mpirun runs inside a network namespace of the test's own (tests/harness/netlab.py): its daemons and the job's
rendezvous listen there only.
"""

from __future__ import annotations

import shutil
import sys

import pytest
from checkrun import worker_env
from engine_runs import TRAIN, TrainingRun, run_job
from netlab import machines

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_mpirun_two_ranks_join_with_a_plain_accelerator(reference_run, tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI is not installed (mpirun missing): run tests/clusters/setup.sh as root")
    with machines(1, hostname_prefix="mpi-node") as (machine,):
        command = ["mpirun", "-np", "2", "--allow-run-as-root", sys.executable, str(TRAIN), str(tmp_path)]
        done = run_job(machine.command(command), worker_env())
    run = TrainingRun.read(tmp_path, done.stdout + done.stderr)
    assert all(r["launcher"] == "OpenMPI" for r in run.reports), run.reports  # OMPI's variables, no torchrun's
    assert {r["master_addr"] for r in run.reports} == {"127.0.0.1"}  # every rank on one machine
    run.assert_same_training(reference_run)
