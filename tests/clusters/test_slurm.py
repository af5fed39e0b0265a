"""Jobs on a real SLURM cluster (tests/harness/slurm.py: slurmctld and two slurmd, each node a network namespace).

- ``srun -n 2 python cluster_train.py``: each task joins with a plain ``Accelerator()`` from SLURM's variables;
- ``srun -n 1 accel launch --cpu -n 2 cluster_train.py``: accel's launcher inside one task;
- ``srun -N 2 accel launch --machine-rank $SLURM_NODEID --num-machines 2 --main-process-ip <node 0> ...``: one
  launcher per node, the two nodes reaching each other over their own addresses.

Each ends with the same final weights as ``accel launch --cpu -n 2`` on this machine, bit for bit.
"""

from __future__ import annotations

import sys

import pytest
from checkrun import worker_env
from engine_runs import TRAIN, TrainingRun, run_job
from nodes import accel_command

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_srun_two_tasks_join_with_a_plain_accelerator(slurm, reference_run, tmp_path):
    command = ["srun", "-N", "1", "-n", "2", sys.executable, str(TRAIN), str(tmp_path)]
    done = run_job(slurm.command(command), slurm.env(worker_env()))
    run = TrainingRun.read(tmp_path, done.stdout + done.stderr)
    assert all(r["launcher"] == "slurm" for r in run.reports), run.reports  # SLURM's variables, no torchrun's
    assert sorted(r["local_rank"] for r in run.reports) == [0, 1]
    assert {r["master_addr"] for r in run.reports} == {slurm.hosts[0].hostname}  # the step's first node
    run.assert_same_training(reference_run)


def test_srun_one_task_running_accel_launch(slurm, reference_run, tmp_path):
    command = ["srun", "-N", "1", "-n", "1", *accel_command(), "launch", "--cpu", "-n", "2", str(TRAIN), str(tmp_path)]
    done = run_job(slurm.command(command), slurm.env(worker_env()))
    run = TrainingRun.read(tmp_path, done.stdout + done.stderr)
    # accel launch's (torchrun's) variables win over the task's SLURM ones (a 1-task step).
    assert all(r["launcher"] == "torchrun" for r in run.reports), run.reports
    run.assert_same_training(reference_run)


def test_two_node_job_one_accel_launch_per_node(slurm, reference_run, tmp_path):
    head = slurm.hosts[0]
    launch = " ".join(
        [
            *accel_command(),
            "launch --cpu --num-machines 2 --machine-rank $SLURM_NODEID -n 2",
            f"--main-process-ip {head.address} --main-process-port 29400",
            f"{TRAIN} {tmp_path}",
        ]
    )
    command = ["srun", "-N", "2", "--ntasks-per-node", "1", "bash", "-c", launch]
    done = run_job(slurm.command(command), slurm.env(worker_env()))
    run = TrainingRun.read(tmp_path, done.stdout + done.stderr)
    hosts = {r["rank"]: r["host"] for r in run.reports}
    assert hosts == {0: head.hostname, 1: slurm.hosts[1].hostname}, hosts  # one process on each node
    assert {r["master_addr"] for r in run.reports} == {head.address}
    run.assert_same_training(reference_run)
