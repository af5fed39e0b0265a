"""accel's collectives over XLA replicas: ``xm.all_gather`` / ``xm.all_reduce`` / ``xm.collective_broadcast``
for tensors, ``xm.rendezvous`` payloads for Python objects.

``accel_core.ops`` (``gather``, ``reduce``, ``broadcast``, ``pad_across_processes``,
``gather_object``, ``broadcast_object_list``) and ``wait_for_everyone`` go through this object
when the xla strategy placed the process (``accel_core.placement``). The tensor collectives are
recorded in the XLA graph like any other operation and run at the next step marker; on one replica
they run too (the same program as on many).

Several replicas need a TPU (or GPUs) here: XLA's CPU device runs one replica per process, and
processes started with PJRT_DEVICE=CPU hang in their first collective (seen with torch-xla 2.9.0).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from .runtime import TorchXla, require_torch_xla

# accel's reduction names -> torch_xla's reduce types ("mean" is a sum divided by the count in accel_core.ops).
REDUCTIONS = {"sum": "sum", "max": "max", "min": "min", "product": "mul"}


def xla_reduce_type(reduction: str) -> str:
    """torch_xla's reduce type for one of accel's reductions; ValueError naming the choices otherwise."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"Unknown reduction {reduction!r} for XLA: use one of {', '.join(REDUCTIONS)}.")
    return REDUCTIONS[reduction]


def pack_object(obj: Any) -> bytes:
    """The payload one process contributes to an object collective (pickled, as torch.distributed's)."""
    return pickle.dumps(obj)


def unpack_objects(payloads: list[bytes], own: Any) -> list[Any]:
    """Every process's object from the exchanged payloads; ``[own]`` when the runtime exchanged nothing (one
    replica: ``xm.rendezvous`` returns no payloads there)."""
    if not payloads:
        return [own]
    return [pickle.loads(p) for p in payloads]


class XlaCollectives:
    """Implements ``accel_core.placement.Collectives`` with torch_xla's collectives over all replicas.

    Example::

        total = XlaCollectives().all_reduce(loss.detach(), "sum")
    """

    def __init__(self, xla: TorchXla | None = None) -> None:
        self._xla = xla if xla is not None else require_torch_xla()
        self._calls = 0  # numbers rendezvous tags, so two object collectives never share one

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every replica's ``tensor`` concatenated on dimension 0."""
        return self._xla.xm.all_gather(tensor, dim=0)

    def all_reduce(self, tensor: torch.Tensor, reduction: str) -> torch.Tensor:
        """A new tensor reduced over the replicas (``xm.all_reduce`` of one tensor is out of place)."""
        return self._xla.xm.all_reduce(xla_reduce_type(reduction), tensor)

    def broadcast(self, tensor: torch.Tensor, from_process: int) -> torch.Tensor:
        """``from_process``'s values, in ``tensor`` itself (``xm.collective_broadcast`` works in place)."""
        self._xla.xm.collective_broadcast([tensor], root_ordinal=from_process)
        return tensor

    def gather_object(self, obj: Any) -> list[Any]:
        """One object per replica, in ordinal order (exchanged out of the graph, through ``xm.rendezvous``)."""
        self._calls += 1
        payloads = self._xla.xm.rendezvous(f"accel.gather_object.{self._calls}", pack_object(obj))
        return unpack_objects(list(payloads), obj)

    def broadcast_object(self, obj: Any, from_process: int) -> Any:
        """``from_process``'s object on every replica."""
        everyone = self.gather_object(obj)
        return everyone[from_process] if len(everyone) > 1 else everyone[0]

    def barrier(self, tag: str) -> None:
        """``xm.rendezvous(tag)``: waits for every replica."""
        self._xla.xm.rendezvous(tag)
