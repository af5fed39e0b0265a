"""The run's settings, settled once (``accel_core.settings.settle``): other launchers' variables into one frozen
record, which the process state and the strategies read; ``os.environ`` is only read.

The launched checks (two processes) are in tests/compat/test_accelerate_launch_env.py (``accelerate launch``'s
variables) and tests/clusters (srun, mpirun): each compares ``os.environ`` before and after ``Accelerator()``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle

import pytest

from accel import Accelerator
from accel_core.accelerate_launch_env import AccelerateLaunchError
from accel_core.cluster_env import ClusterEnv
from accel_core.settings import RunSettings, settle
from accel_core.state import AcceleratorState, GradientState, PartialState

# srun -N 2 --ntasks-per-node 4: task 5 (node 1, local id 1).
SRUN = {
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_ID": "4242",
}
# mpirun -n 2 on one machine: rank 1.
MPIRUN = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
# A Kubeflow PyTorchJob pod running the script itself: pod 2 of 3.
PYTORCHJOB = {
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "RANK": "2",
    "WORLD_SIZE": "3",
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
}
TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29400",
}


def _place(settings: RunSettings) -> tuple:
    return (settings.launcher, settings.rank, settings.world_size, settings.local_rank, settings.local_world_size)


def test_srun_task_settles_as_torchrun_would_name_it_without_touching_the_given_mapping() -> None:
    given = dict(SRUN)
    settings = settle(given)
    assert given == SRUN  # only read
    assert _place(settings) == ("slurm", 5, 8, 1, 4)
    assert (settings.master_addr, settings.master_port) == ("gpu07", 15000 + 4242 % 20000)
    assert {name: settings.environ[name] for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")} == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "gpu07",
    }
    assert settings.translated["LOCAL_WORLD_SIZE"] == "4"
    assert settings.rendezvous_url == "tcp://gpu07:19242"  # joined without env://: the ranks are in the record


def test_mpirun_and_pytorchjob_settle_their_place() -> None:
    mpi = settle(MPIRUN)
    assert _place(mpi) == ("OpenMPI", 1, 2, 1, 2)
    assert mpi.rendezvous_url == "tcp://127.0.0.1:29500"  # every rank on this machine
    pod = settle(PYTORCHJOB)
    assert _place(pod) == ("kubeflow", 2, 3, 0, 1)
    assert pod.rendezvous_url == "tcp://job-master-0:23456"
    assert "RANK" not in pod.translated  # the operator's own RANK / MASTER_ADDR are kept as they are
    assert pod.translated == {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert settle({**MPIRUN, "MASTER_ADDR": "fe80::1"}).rendezvous_url == "tcp://[fe80::1]:29500"


def test_torchrun_variables_win_and_keep_env_rendezvous() -> None:
    settings = settle({**SRUN, **TORCHRUN})  # torchrun (or accel launch) inside an srun step
    assert _place(settings) == ("torchrun", 3, 4, 1, 2)
    assert settings.translated == {} and settings.environ["MASTER_ADDR"] == "n1"
    assert settings.rendezvous_url is None  # torchrun's env:// and agent store stay


def test_a_lone_process() -> None:
    settings = settle({})
    assert _place(settings) == (None, 0, 1, 0, 1)
    assert settings.master_addr is None and settings.rendezvous_url is None and settings.translated == {}


def test_accelerate_launch_settings_are_translated_into_the_record() -> None:
    given = {
        "ACCELERATE_MIXED_PRECISION": "bf16",
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_VERSION": "2",
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
        **TORCHRUN,
    }
    settings = settle(given)
    assert settings.get_str("ACCEL_MIXED_PRECISION") == "bf16"
    assert settings.translated["ACCEL_STRATEGY"] == "fsdp" and settings.environ["ACCEL_FSDP_VERSION"] == "2"
    assert settings.get_int("ACCEL_TP_SIZE") == 2
    assert not any(name.startswith("ACCEL_") for name in given)
    with pytest.raises(AccelerateLaunchError, match="MEGATRON_LM_RECOMPUTE_GRANULARITY=full"):
        settle({"ACCELERATE_USE_MEGATRON_LM": "true", "MEGATRON_LM_RECOMPUTE_GRANULARITY": "full"})


def test_the_record_is_frozen_and_pickles() -> None:
    settings = settle(SRUN)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.job = None  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.environ["RANK"] = "0"  # type: ignore[index]
    copy = pickle.loads(pickle.dumps(settings))
    assert copy == settings and copy.job == ClusterEnv("slurm", 5, 8, 1, 4, "gpu07", 19242)


@pytest.fixture
def fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_accelerator_reads_another_launchers_variables_and_writes_none(
    monkeypatch: pytest.MonkeyPatch, fresh_state
) -> None:
    # A one-task srun step started with `accelerate launch`'s bf16 setting: the record carries both.
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    lone_task = {**SRUN, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    for name, value in {**lone_task, "SLURM_STEP_TASKS_PER_NODE": "1", "ACCELERATE_MIXED_PRECISION": "bf16"}.items():
        monkeypatch.setenv(name, value)
    before = dict(os.environ)
    accelerator = Accelerator(cpu=True)
    assert dict(os.environ) == before
    assert accelerator.mixed_precision == "bf16"
    settings = accelerator.strategy.context.settings
    assert settings is PartialState().settings  # one record: the process state's is the Accelerator's
    assert settings.launcher == "slurm" and settings.environ["ACCEL_MIXED_PRECISION"] == "bf16"


def test_a_process_state_made_alone_settles_for_itself(monkeypatch: pytest.MonkeyPatch, fresh_state) -> None:
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "true")
    before = dict(os.environ)
    state = PartialState(cpu=True)
    assert dict(os.environ) == before
    assert state.debug is True and state.settings.environ["ACCEL_DEBUG_MODE"] == "true"
