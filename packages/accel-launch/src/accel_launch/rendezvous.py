"""How the machines and restarts of a job meet: torchrun's rendezvous, chosen, checked and spelled as arguments.

One machine: torchrun's c10d rendezvous, on a free local port (torchrun's own choice when no port is
given) or on ``--main-process-port``, whatever ``rdzv_backend`` says: the setting is about several
machines (its help says so), and config files carry ``rdzv_backend: static`` by default (accel's and
Accelerate's alike), so on one machine it is no deliberate choice, while the static rendezvous would
break restarts there (below). Several machines: the static rendezvous unless restarts or an elastic
size need c10d's (or etcd's).

Why c10d where restarts may happen: the static rendezvous fixes each machine's rank and the number of
machines for the whole job, counts restarts per agent, and serves one store to every attempt. A
machine whose agent was lost and started again begins at restart 0 while the others are at 1, and its
workers read the lost attempt's addresses (measured on two agents over 127.0.0.1: ``Gloo
connectFullMesh failed ... Connection refused``, the job fails); a worker that sets a process group up
itself (DeepSpeed's, a script's ``init_process_group``) reads the killed attempt's keys. Nor can it
change the number of machines. The c10d rendezvous runs a new round for every restart, where a
restarted agent joins and an elastic job meets with the machines it has.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from .settings import DEFAULT, SETTINGS_BY_NAME, origin

DEFAULT_PORT = 29500
RDZV_STORE_SHARING_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class RendezvousLayout(Protocol):
    """What this module reads of a launch plan (``plan.LaunchPlan`` is one, frozen, hence read-only properties): the
    machines, the restarts and the rendezvous settings, with where each setting came from (for messages)."""

    @property
    def num_machines(self) -> int: ...
    @property
    def machine_rank(self) -> int: ...
    @property
    def main_process_ip(self) -> str | None: ...
    @property
    def main_process_port(self) -> int | None: ...
    @property
    def rdzv_backend(self) -> str: ...
    @property
    def rdzv_conf(self) -> str | None: ...
    @property
    def max_restarts(self) -> int: ...
    @property
    def sources(self) -> dict[str, str]:
        """Where each setting came from (``settings.DEFAULT``, a flag, the config file...)."""
        ...

    @property
    def config_file(self) -> str | None: ...
    @property
    def elastic(self) -> bool:
        """A MIN:MAX number of machines."""
        ...

    @property
    def nnodes(self) -> str:
        """The number of machines as torchrun's ``--nnodes`` spells it (``N`` or ``MIN:MAX``)."""
        ...


def _several_machines(values: dict[str, Any]) -> bool:
    return values["num_machines"] > 1 or values["min_machines"] is not None


def choose_backend(values: dict[str, Any], sources: dict[str, str], config_file: str | None) -> None:
    """Sets ``values["rdzv_backend"]`` for several machines: c10d with restarts or MIN:MAX unless one is named.

    A static rendezvous asked for with an elastic size is refused (it fixes the number of machines).
    """
    if not _several_machines(values):
        return
    wants_dynamic = values["max_restarts"] > 0 or values["min_machines"] is not None
    if sources["rdzv_backend"] == DEFAULT and wants_dynamic:
        values["rdzv_backend"] = "c10d"
    if values["rdzv_backend"] == "static" and values["min_machines"] is not None:
        where = origin(SETTINGS_BY_NAME["rdzv_backend"], sources["rdzv_backend"], config_file)
        raise ValueError(
            f"{where}: the static rendezvous fixes the number of machines, an elastic --num-machines "
            f"{values['min_machines']}:{values['num_machines']} needs a dynamic one: pass --rdzv-backend c10d "
            "(the default of an elastic job) or etcd."
        )


def check_conf(values: dict[str, Any], sources: dict[str, str], config_file: str | None) -> None:
    """``rdzv_conf`` is torchrun's ``KEY=VALUE[,KEY=VALUE]``, for a dynamic rendezvous (the static one reads none)."""
    conf = values.get("rdzv_conf")
    if not conf:
        return
    where = origin(SETTINGS_BY_NAME["rdzv_conf"], sources["rdzv_conf"], config_file)
    malformed = [part for part in conf.split(",") if not re.fullmatch(r"\s*[A-Za-z_][\w.]*\s*=.*", part)]
    if malformed:
        raise ValueError(
            f"{where}: {malformed[0]!r} is not KEY=VALUE; write e.g. --rdzv-conf last_call_timeout=5,join_timeout=600."
        )
    if values["rdzv_backend"] == "static" and _several_machines(values):
        raise ValueError(
            f"{where}: the static rendezvous of several machines takes no settings; pass --rdzv-backend c10d with "
            "them, or leave rdzv_conf out."
        )


def warning(plan: RendezvousLayout) -> str | None:
    """What a launch should say before it starts: a layout that cannot survive what the user likely expects it to.

    Restarts of several machines under a static rendezvous asked for; an elastic job without restarts (the
    survivors' workers fail in their next collective, and only a restart shrinks the world).
    """
    if plan.elastic and plan.max_restarts == 0:
        return (
            f"an elastic job (--num-machines {plan.nnodes}) without --max-restarts ends when a machine is lost: the "
            "others' workers fail in their next collective and only a restart continues on fewer machines. Pass "
            "--max-restarts N (and --auto-resume to continue from the newest checkpoint)."
        )
    if plan.rdzv_backend == "static" and plan.num_machines > 1 and plan.max_restarts > 0:
        where = origin(SETTINGS_BY_NAME["rdzv_backend"], plan.sources.get("rdzv_backend", DEFAULT), plan.config_file)
        return (
            f"the static rendezvous ({where}) restarts the workers after a worker fails, but a machine whose "
            "`accel launch` is lost and started again cannot rejoin it (the job fails). Drop rdzv_backend or pass "
            "--rdzv-backend c10d: with --max-restarts that is the default of several machines."
        )
    return None


def torchrun_arguments(plan: RendezvousLayout) -> list[str]:
    """The rendezvous part of torchrun's command line for ``plan`` (empty: torchrun's own, on a free local port)."""
    port = plan.main_process_port
    address = f"{plan.main_process_ip or '127.0.0.1'}:{port or DEFAULT_PORT}"
    if plan.num_machines > 1 or plan.elastic:
        if plan.rdzv_backend == "static":
            return [
                f"--node-rank={plan.machine_rank}",
                f"--master-addr={plan.main_process_ip}",
                f"--master-port={port or DEFAULT_PORT}",
            ]
        argv = [f"--rdzv-backend={plan.rdzv_backend}", f"--rdzv-endpoint={address}"]
        conf = [plan.rdzv_conf] if plan.rdzv_conf else []
        if plan.rdzv_backend == "c10d" and plan.sources.get("machine_rank", DEFAULT) != DEFAULT:
            # Which agent serves the rendezvous store: torch guesses from the endpoint's host name,
            # and every agent of a job on one machine's loopback (or behind one name) would guess
            # itself. A machine rank given says it: machine 0 serves, the others connect.
            conf.append(f"is_host={str(plan.machine_rank == 0).lower()}")
        return [*argv, f"--rdzv-conf={','.join(conf)}"] if conf else argv
    if port is not None:
        # One machine: the c10d rendezvous on that port, as torchrun does on a free port when none is given.
        # Not the static one: its agent serves one store to every attempt (see the module's text).
        # is_host: this agent serves the store. torch otherwise joins, as a client, a store another job already
        # serves on that port (one started a moment earlier, after check_port_free looked): the second job then
        # waited for the first one to end and failed with a connection error.
        conf = [plan.rdzv_conf] if plan.rdzv_conf else []
        if not re.search(r"(^|,)\s*is_host\s*=", plan.rdzv_conf or ""):
            conf.append("is_host=true")
        return ["--rdzv-backend=c10d", f"--rdzv-endpoint={address}", f"--rdzv-conf={','.join(conf)}"]
    # One machine and no port: torchrun's own rendezvous on a free local port.
    return [f"--rdzv-conf={plan.rdzv_conf}"] if plan.rdzv_conf else []
