"""The store a restarted worker joins its process group through: the agent's, under this attempt's prefix.

torchrun's agent can serve one TCPStore to the workers of every attempt (the static rendezvous always
does; the c10d one unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) and tells them so with
``TORCHELASTIC_USE_AGENT_STORE=True``. ``init_process_group("env://")`` then joins that store with no
per-attempt prefix (torch assumes a new store for every attempt): a group set up again after a restart
(the default one, ``new_group``'s) reads the keys the killed attempt left there, such as a dead peer's
gloo address, and fails with ``Connection refused`` or waits for keys that are already spent.
Prefixing the store with the restart count gives each attempt keys of its own.

The same store carries a roll call before the default group is set up (``wait_for_peers``): a rank whose launched
function (``notebook_launcher``) or script (``accel launch``) returned notes it there (``note_returned``), and a
rank waiting for its peers stops with an error naming the ones that returned instead of waiting in gloo's or
NCCL's setup, which nothing interrupts, until the group timeout. torch's agent then restarts the attempt (or
reports the failure): a peer that returned is a success to the agent, which would otherwise wait with the rank
blocked in the setup for as long as the timeout (30 minutes by default). The wait is in Python, so the agent's
SIGTERM ends such a rank at once, where one blocked in the setup ignores it until the SIGKILL 30 s later.
"""

from __future__ import annotations

import os
import time
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


def attempt_store(world_size: int, timeout: timedelta, environ: Mapping[str, str] | None = None) -> dist.Store | None:
    """A client of the agent's store under this attempt's prefix, or None where torch's env:// is right.
    environ: the run's settled variables (``os.environ`` when not given)."""
    environ = os.environ if environ is None else environ
    prefix = attempt_prefix(environ)
    if prefix is None:
        return None
    store = dist.TCPStore(
        environ[env.MASTER_ADDR], int(environ[env.MASTER_PORT]), world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(prefix, store)


# Keys under the attempt's prefix: the ranks that reached the default group's setup, and those whose function or
# script returned.
_ARRIVED = "group_setup/arrived"  # a counter; and group_setup/rank<r> per rank
_ALL_ARRIVED = "group_setup/all_arrived"
_RETURNED = "returned"  # a counter; and returned/rank<r> per rank
_POLL = timedelta(milliseconds=100)  # how often a waiting rank looks for peers that returned


def note_returned(rank: int) -> None:
    """Notes in the agent's store that this rank's launched function or script returned (never raises).

    Lets a peer still waiting for it in ``wait_for_peers`` stop at once. Nothing is written where the agent
    does not share its store (``attempt_prefix`` is None).
    """
    prefix = attempt_prefix()
    if prefix is None:
        return
    try:
        client = dist.TCPStore(
            os.environ[env.MASTER_ADDR], int(os.environ[env.MASTER_PORT]), is_master=False, timeout=timedelta(seconds=5)
        )
        store = dist.PrefixStore(prefix, client)
        store.set(f"{_RETURNED}/rank{rank}", "1")
        store.add(_RETURNED, 1)
    except (RuntimeError, OSError, ValueError):  # the store gone (the agent stopping): nobody left to tell
        return


def wait_for_peers(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
    """Waits until every rank of this attempt has reached the default group's setup.

    Raises ``RuntimeError`` naming the ranks that returned (``note_returned``) before reaching it, since they
    never will, or, after ``timeout``, the ranks that did not come.
    """
    store.set(f"{_ARRIVED}/rank{rank}", "1")
    if store.add(_ARRIVED, 1) >= world_size:
        store.set(_ALL_ARRIVED, "1")
        return
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        try:
            store.wait([_ALL_ARRIVED], _POLL)
            return
        except RuntimeError:  # torch's DistStoreError on the poll's timeout: look for returned peers
            pass
        if store.add(_RETURNED, 0) > 0:
            gone = [r for r in range(world_size) if store.check([f"{_RETURNED}/rank{r}"])]
            raise RuntimeError(
                f"Rank {rank} is setting up the process group, but {_ranks(gone)} already returned without "
                f"setting it up, so {'it' if len(gone) == 1 else 'they'} will never join: every process must "
                "create the `Accelerator` (or `PartialState`), or none. (In a restarted attempt of "
                "notebook_launcher or accel launch, this failure starts the next attempt.)"
            )
        if time.monotonic() > deadline:
            absent = [r for r in range(world_size) if not store.check([f"{_ARRIVED}/rank{r}"])]
            raise RuntimeError(
                f"Rank {rank} waited {timeout} for the other processes to set up the process group; {_ranks(absent)} "
                "did not come (still busy before creating the `Accelerator`, or stopped)."
            )


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
