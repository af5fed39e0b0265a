"""``mpirun -np 2 python cluster_train.py`` (OpenMPI): each rank joins with a plain ``Accelerator()`` from
OpenMPI's ``OMPI_COMM_WORLD_*`` variables, and trains as ``accel launch --cpu -n 2`` does, bit for bit; and the same
job with DeepSpeed ZeRO-2, whose ranks join through ``deepspeed.init_distributed`` at the settled record's address.

mpirun runs inside a network namespace of the test's own (tests/harness/netlab.py): its daemons and the job's
rendezvous listen there only.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from checkrun import worker_env
from engine_runs import TRAIN, TrainingRun, run_job
from netlab import machines

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def mpirun(out: Path, *options: str, extra_env: dict[str, str] | None = None, timeout: float = 180) -> TrainingRun:
    """``mpirun -np 2 cluster_train.py <out> <options>`` inside a machine of its own; what the ranks wrote."""
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI is not installed (mpirun missing): run tests/clusters/setup.sh as root")
    with machines(1, hostname_prefix="mpi-node") as (machine,):
        command = ["mpirun", "-np", "2", "--allow-run-as-root", sys.executable, str(TRAIN), str(out), *options]
        done = run_job(machine.command(command), worker_env(extra_env), timeout=timeout)
    run = TrainingRun.read(out, done.stdout + done.stderr)
    assert all(r["launcher"] == "OpenMPI" for r in run.reports), run.reports  # OMPI's variables, no torchrun's
    assert {r["master_addr"] for r in run.reports} == {"127.0.0.1"}  # every rank on one machine
    # Joined at the settled record's address (rank 0's, mpirun's default port), not torchrun's env://.
    assert {r["init_method"] for r in run.reports} == {"tcp://127.0.0.1:29500"}, run.reports
    return run


def test_mpirun_two_ranks_join_with_a_plain_accelerator(reference_run, tmp_path):
    run = mpirun(tmp_path)
    assert all(r["local_rank_variable"] is None for r in run.reports), run.reports  # mpirun sets no LOCAL_RANK
    run.assert_same_training(reference_run)


def test_mpirun_deepspeed_zero2_joins_over_tcp_from_the_settled_record(reference_run, tmp_path):
    # DeepSpeed builds its shared-memory op the first time (minutes, once per TORCH_EXTENSIONS_DIR): a longer limit.
    # DS_ACCELERATOR: the script imports deepspeed before Accelerator() (to tell its import's variables apart), so
    # DeepSpeed must be told the CPU (ACCEL_USE_CPU's device) itself on a machine with a GPU.
    run = mpirun(tmp_path, "--deepspeed", extra_env={"DS_ACCELERATOR": "cpu"}, timeout=600)
    for report in run.reports:
        # Accelerator() wrote one variable, LOCAL_RANK, which DeepSpeed's engine reads only from os.environ.
        assert report["environ_changed"] == ["LOCAL_RANK"], report
        assert report["local_rank_variable"] == str(report["local_rank"]) == str(report["rank"]), report
    run.assert_deepspeed_training(reference_run)
