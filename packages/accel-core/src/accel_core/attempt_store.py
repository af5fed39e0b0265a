"""The store a restarted worker joins its process group through: the agent's, under this attempt's prefix.

torchrun's agent can serve one TCPStore to the workers of every attempt (the static rendezvous always
does; the c10d one unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) and tells them so with
``TORCHELASTIC_USE_AGENT_STORE=True``. ``init_process_group("env://")`` then joins that store with no
per-attempt prefix (torch assumes a new store for every attempt): a group set up again after a restart
(the default one, ``new_group``'s) reads the keys the killed attempt left there, such as a dead peer's
gloo address, and fails with ``Connection refused`` or waits for keys that are already spent.
Prefixing the store with the restart count gives each attempt keys of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as dist

from . import environment as env


def attempt_prefix(environ: Mapping[str, str] | None = None) -> str | None:
    """``accel/attempt_<n>/`` when the agent shares its store with every attempt, else None."""
    environ = os.environ if environ is None else environ
    if environ.get(env.USE_AGENT_STORE) != str(True):
        return None
    if not environ.get(env.MASTER_ADDR) or not environ.get(env.MASTER_PORT):
        return None
    return f"accel/attempt_{environ.get(env.RESTART_COUNT, '0')}/"


def attempt_store(world_size: int, timeout: timedelta) -> dist.Store | None:
    """A client of the agent's store under this attempt's prefix, or None where torch's env:// is right."""
    prefix = attempt_prefix()
    if prefix is None:
        return None
    store = dist.TCPStore(
        os.environ[env.MASTER_ADDR], int(os.environ[env.MASTER_PORT]), world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(prefix, store)
