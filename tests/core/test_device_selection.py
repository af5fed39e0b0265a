"""Which device a process takes, with the GPU count and the launcher's environment faked (no GPU is needed).

SLURM with ``--gpus-per-task=1`` (or ``--gpu-bind``) shows each task one GPU while ``SLURM_LOCALID`` (so
``LOCAL_RANK``) runs up to the tasks per node: the one visible device is the process's own.
"""

from __future__ import annotations

import pytest
import torch

from accel_core.settings import settle
from accel_core.state.process_state import _pick_device


def _slurm_task(local_id: int) -> dict[str, str]:
    """The variables srun sets in task ``local_id`` of a one-node step of 8 tasks (node 0, so rank = local id)."""
    return {
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_PROCID": str(local_id),
        "SLURM_LOCALID": str(local_id),
        "SLURM_NODEID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "8",
        "SLURM_STEP_NODELIST": "gpu01",
        "SLURM_JOB_ID": "4242",
    }


@pytest.fixture
def visible_gpus(monkeypatch: pytest.MonkeyPatch):
    def fake(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    return fake


def test_one_gpu_per_task_is_the_process_device_whatever_its_local_rank(visible_gpus) -> None:
    visible_gpus(1)
    settings = settle(_slurm_task(5))
    assert settings.local_rank == 5 and settings.environ["LOCAL_RANK"] == "5"
    assert _pick_device(False, settings.local_rank, 8) == torch.device("cuda", 0)


def test_several_visible_gpus_are_picked_by_local_rank(visible_gpus) -> None:
    visible_gpus(8)
    assert _pick_device(False, settle(_slurm_task(5)).local_rank, 8) == torch.device("cuda", 5)


def test_too_few_visible_gpus_for_the_local_ranks_is_refused(visible_gpus) -> None:
    visible_gpus(4)
    with pytest.raises(ValueError, match="local rank 5 has no cuda device of its own: this machine has 4"):
        _pick_device(False, 5, 8)
    assert _pick_device(True, 5, 8) == torch.device("cpu")  # --cpu still wins
