"""Joining a job another launcher started: SLURM's ``srun``, OpenMPI / MPICH ``mpirun``, a Kubernetes PyTorchJob.

Each launcher describes a process's place in the job with its own variables. One small function per
launcher reads them into a ``ClusterEnv``; ``torchrun_variables`` translates the one found into torchrun's
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) for
the settled record (``accel_core.settings``), never into ``os.environ``: the process state joins such a job at
``tcp://MASTER_ADDR:MASTER_PORT`` with the record's rank and world size. torchrun's own
variables win: a job ``accel launch`` or torchrun started (even inside an ``srun`` step) is left as it is.
No torch import.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class ClusterEnv:
    """A process's place in a job: ranks, sizes and where rank 0 listens (``None``: not known)."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None


def _int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"Environment variable {name}={raw!r} must be an integer.") from None


def _port(environ: Mapping[str, str], default: int | None) -> int | None:
    port = _int(environ, "MASTER_PORT")
    return default if port is None else port


def from_torchrun(environ: Mapping[str, str]) -> ClusterEnv | None:
    """torchrun / ``accel launch`` (and a PyTorchJob running torchrun in each pod, from its ``PET_*`` options)."""
    rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    if rank is None or world is None:
        return None
    local = _int(environ, "LOCAL_RANK") or 0
    local_world = _int(environ, "LOCAL_WORLD_SIZE") or world
    return ClusterEnv("torchrun", rank, world, local, local_world, environ.get("MASTER_ADDR"), _port(environ, None))


def from_kubeflow(environ: Mapping[str, str]) -> ClusterEnv | None:
    """A Kubeflow PyTorchJob pod running the script itself: one process per pod.

    The operator sets ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` (the number of pods) and
    ``RANK`` (the pod's index), but no ``LOCAL_RANK``: each pod is its own machine.
    """
    if "KUBERNETES_SERVICE_HOST" not in environ or "LOCAL_RANK" in environ:
        return None
    rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    if rank is None or world is None or not environ.get("MASTER_ADDR"):
        return None
    return ClusterEnv("kubeflow", rank, world, 0, 1, environ["MASTER_ADDR"], _port(environ, DEFAULT_PORT))


def from_slurm(environ: Mapping[str, str]) -> ClusterEnv | None:
    """A task of an ``srun`` step: one process per task.

    Only ``srun`` sets the step's variables (``SLURM_STEP_NUM_TASKS``): the batch script itself,
    which sees the allocation's ``SLURM_NTASKS``, is a single process. Rank 0 runs on the first
    node of the step; its port is ``MASTER_PORT``, else one derived from the job id, so that two
    jobs sharing a node do not collide.
    """
    world, rank = _int(environ, "SLURM_STEP_NUM_TASKS"), _int(environ, "SLURM_PROCID")
    if world is None or rank is None:
        return None
    local = _int(environ, "SLURM_LOCALID") or 0
    per_node = expand_tasks_per_node(
        environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    )
    node = _int(environ, "SLURM_NODEID") or 0
    local_world = per_node[node] if node < len(per_node) else world
    address = environ.get("MASTER_ADDR")
    if not address:
        nodes = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        hosts = slurm_hostnames(nodes) if nodes else []
        address = hosts[0] if hosts else environ.get("SLURM_LAUNCH_NODE_IPADDR")
    job = _int(environ, "SLURM_JOB_ID")
    port = _port(environ, DEFAULT_PORT if job is None else 15000 + job % 20000)
    return ClusterEnv("slurm", rank, world, local, local_world, address, port)


def _mpi(
    environ: Mapping[str, str], launcher: str, rank_var: str, size_var: str, local_var: str, local_size_var: str
) -> ClusterEnv | None:
    rank, world = _int(environ, rank_var), _int(environ, size_var)
    if rank is None or world is None:
        return None
    local = _int(environ, local_var) or 0
    local_world = _int(environ, local_size_var) or world
    address = environ.get("MASTER_ADDR")
    if not address and local_world == world:
        address = "127.0.0.1"  # every rank on this machine
    if not address and world > 1:
        raise ValueError(
            f"This {launcher} job spans several machines and MPI does not say where rank 0 runs: export "
            f"MASTER_ADDR=<host of rank 0> to every rank (e.g. `mpirun -x MASTER_ADDR=node01 ...`, MPICH: "
            "`-genv MASTER_ADDR node01`), and MASTER_PORT if 29500 is taken."
        )
    return ClusterEnv(launcher, rank, world, local, local_world, address, _port(environ, DEFAULT_PORT))


def from_openmpi(environ: Mapping[str, str]) -> ClusterEnv | None:
    """A rank of OpenMPI's ``mpirun`` (``OMPI_COMM_WORLD_*``)."""
    names = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    return _mpi(environ, "OpenMPI", *names)


def from_mpich(environ: Mapping[str, str]) -> ClusterEnv | None:
    """A rank of MPICH / Intel MPI's Hydra ``mpiexec`` (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``)."""
    return _mpi(environ, "MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


# In order: torchrun's variables win over the schedulers'. A PyTorchJob pod's RANK / WORLD_SIZE are
# torchrun's names without LOCAL_RANK: its detector, which needs that absence, goes first.
DETECTORS: tuple[Callable[[Mapping[str, str]], ClusterEnv | None], ...] = (
    from_kubeflow,
    from_torchrun,
    from_slurm,
    from_openmpi,
    from_mpich,
)


def detect(environ: Mapping[str, str] | None = None) -> ClusterEnv | None:
    """The job this process belongs to, per the first launcher whose variables are present; ``None``: a lone process."""
    environ = os.environ if environ is None else environ
    for detector in DETECTORS:
        found = detector(environ)
        if found is not None:
            return found
    return None


def torchrun_variables(found: ClusterEnv | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The job ``found`` in torchrun's variables, those ``environ`` does not set already (a pure translation:
    ``settings.settle`` applies it to its copy of the environment; nothing is written to ``os.environ``).

    Example (in a task of ``srun -N 2 --ntasks-per-node 4 python train.py``)::

        torchrun_variables(detect(environ), environ)  # {"RANK": <SLURM_PROCID>, "WORLD_SIZE": "8", ...}
    """
    if found is None or found.launcher == "torchrun":
        return {}
    values = {
        "RANK": found.rank,
        "WORLD_SIZE": found.world_size,
        "LOCAL_RANK": found.local_rank,
        "LOCAL_WORLD_SIZE": found.local_world_size,
        "MASTER_ADDR": found.master_addr,
        "MASTER_PORT": found.master_port,
    }
    return {name: str(value) for name, value in values.items() if value is not None and not environ.get(name)}


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's ``2(x3),1`` as ``[2, 2, 2, 1]`` (tasks on each node of the step)."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return []
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_hostnames(nodelist: str, use_scontrol: bool = True) -> list[str]:
    """The hosts of a SLURM node list, in order: ``node[01-03],gpu7`` -> node01, node02, node03, gpu7.

    ``scontrol show hostnames`` answers where SLURM is installed; elsewhere (or when it fails) the
    list is expanded here (ranges keep their zero padding; one bracket group per name, as SLURM writes them).
    """
    if use_scontrol and shutil.which("scontrol"):
        try:
            out = subprocess.run(
                ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    hosts: list[str] = []
    for prefix, group, suffix in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", nodelist):
        if not group:
            hosts.append(prefix + suffix)
            continue
        for item in group.split(","):
            first, _, last = item.partition("-")
            if not last:
                hosts.append(f"{prefix}{first}{suffix}")
                continue
            width = len(first)
            hosts += [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(first), int(last) + 1)]
    return hosts
