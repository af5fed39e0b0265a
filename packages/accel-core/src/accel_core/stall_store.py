"""The stall watch's client of the job's store: connected by the watch thread, timed call by call.

The store: the agent's (``TORCHELASTIC_USE_AGENT_STORE``, under this attempt's prefix, see ``attempt_store``) or the
one rank 0 serves for ``env://``, both at ``MASTER_ADDR:MASTER_PORT``; a client connection of the watch's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from . import environment as env
from .attempt_store import attempt_prefix

R = TypeVar("R")


class TimedStore:
    """The watch's store client, noting since when a call has been running (``busy_for``): a TCPStore client
    waits forever for the answer on a connection whose link went down."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._since = 0.0  # time.monotonic() at the start of the call in progress, 0 between calls

    def busy_for(self, now: float) -> float:
        """Seconds the call in progress has been running (0 without one)."""
        since = self._since
        return now - since if since else 0.0

    def _call(self, method: Callable[..., R], *args: Any) -> R:
        self._since = time.monotonic()
        try:
            return method(*args)
        finally:
            self._since = 0.0

    def add(self, key: str, amount: int) -> int:
        return self._call(self._store.add, key, amount)

    def set(self, key: str, value: str) -> None:
        self._call(self._store.set, key, value)

    def get(self, key: str) -> bytes:
        return self._call(self._store.get, key)

    def check(self, keys: list[str]) -> bool:
        return self._call(self._store.check, keys)


def connect_store(timeout: timedelta, environ: Mapping[str, str]) -> tuple[Any, bool]:
    """A client of the job's store (see the module docstring), or None; and whether MASTER_ADDR names one.

    environ: the run's settled variables (``RunSettings.environ``: a job srun or mpirun started names rank 0 there,
    not in ``os.environ``)."""
    address, port = environ.get(env.MASTER_ADDR), environ.get(env.MASTER_PORT)
    if not address or not port:
        return None, False
    try:
        import torch.distributed as dist

        store = dist.TCPStore(address, int(port), is_master=False, timeout=timeout)
        prefix = attempt_prefix()
        return (dist.PrefixStore(prefix, store) if prefix is not None else store), True
    except (RuntimeError, OSError, ValueError):  # DistNetworkError is a RuntimeError
        return None, True
