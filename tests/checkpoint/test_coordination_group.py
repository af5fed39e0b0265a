"""The checkpoint coordinator's gloo group: made while the Accelerator sets up with several processes (checked in
mp_checkpoint.py under torchrun), never with one: a lone process neither waits for nor builds a group."""

from __future__ import annotations

import torch.distributed as dist

from accel_checkpoint.coordination import Coordinator
from accel_core import Accelerator
from accel_core.strategies import groups


def test_one_process_makes_no_coordination_group() -> None:
    Accelerator(cpu=True)
    assert groups._COORDINATION == {}  # the cache itself
    assert groups.coordination_group() is None
    coordinator = Coordinator()
    assert (coordinator.group, coordinator.world_size) == (None, 1)
    assert coordinator.gather("x") == ["x"]
    assert not dist.is_initialized() or dist.get_world_size() == 1
