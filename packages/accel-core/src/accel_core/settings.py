"""The run's settings, settled once from the environment into a frozen record (``RunSettings``) before anything else.

``settle(environ)`` is pure: it reads a copy of the environment, applies the two translations accel makes of other
launchers' variables (``accelerate launch``'s settings under accel's ``ACCEL_*`` names, ``accelerate_launch_env``; a
job ``srun`` / ``mpirun`` / a PyTorchJob started, as torchrun's ``RANK`` / ``WORLD_SIZE`` / ..., ``cluster_env``), and
records the result with this process's place in the job. Names already set win over a translation (accel's own
spelling, torchrun's own variables). Nothing is written back: ``os.environ`` after ``Accelerator()`` is what it was.

The Accelerator settles once, first thing in its set-up, and hands the record on: to the process state (rank, world,
where rank 0 listens), to the strategy (``from_plugin``, ``parallelism``, ``setup_environment``, then
``StrategyContext.settings``). A ``PartialState`` made alone settles for itself, and so does a backend built by a
script without an Accelerator (``settle_environment``). No torch import.

Example (a task of ``srun -N 2 --ntasks-per-node 4 python train.py``)::

    settings = settle(os.environ)
    settings.launcher, settings.rank, settings.world_size  # ("slurm", <SLURM_PROCID>, 8)
    settings.environ["MASTER_ADDR"]  # the step's first node
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from . import accelerate_launch_env, cluster_env
from . import environment as env
from .cluster_env import ClusterEnv


class FrozenEnviron(Mapping[str, str]):
    """A read-only copy of environment variables (a plain mapping: it pickles, compares and prints as one)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"FrozenEnviron({len(self._values)} variables)"

    def __getstate__(self) -> dict[str, str]:
        return self._values

    def __setstate__(self, state: dict[str, str]) -> None:
        self._values = state


@dataclass(frozen=True)
class RunSettings:
    """What the run was started with, settled once (see the module docstring).

    environ: the effective variables: the process's environment with the translations applied (read-only).
    job: this process's place in a job a launcher started (``None``: a lone process).
    translated: the variables the translations added (what another launcher said, in accel's / torchrun's names).
    """

    environ: Mapping[str, str] = field(default_factory=lambda: FrozenEnviron({}))
    job: ClusterEnv | None = None
    translated: Mapping[str, str] = field(default_factory=lambda: FrozenEnviron({}))

    # -- this process's place in the job -----------------------------------------------------------
    @property
    def launcher(self) -> str | None:
        """Who started the job: "torchrun" (torchrun, ``accel launch``), "slurm", "OpenMPI", "MPICH", "kubeflow";
        ``None`` for a lone process."""
        return None if self.job is None else self.job.launcher

    @property
    def world_size(self) -> int:
        return 1 if self.job is None else self.job.world_size

    @property
    def rank(self) -> int:
        return 0 if self.job is None else self.job.rank

    @property
    def local_rank(self) -> int:
        return 0 if self.job is None else self.job.local_rank

    @property
    def local_world_size(self) -> int:
        return self.world_size if self.job is None else self.job.local_world_size

    @property
    def master_addr(self) -> str | None:
        """Where rank 0 serves the job's store (``None``: not known)."""
        return None if self.job is None else self.job.master_addr

    @property
    def master_port(self) -> int | None:
        return None if self.job is None else self.job.master_port

    @property
    def rendezvous_url(self) -> str | None:
        """``tcp://addr:port`` to join the process group without ``env://``, for a job another launcher than
        torchrun started (its ranks are in this record, not in ``os.environ``); ``None`` under torchrun (its
        ``env://`` and agent store stay as they are: elastic restarts need them) or for a lone process."""
        if self.job is None or self.job.launcher == "torchrun" or self.world_size < 2:
            return None
        if not self.master_addr or self.master_port is None:
            raise ValueError(
                f"This {self.launcher} job does not say where rank 0 runs: export MASTER_ADDR=<host of rank 0> "
                "(and MASTER_PORT) to every process."
            )
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"

    # -- the settings' variables -----------------------------------------------------------------
    def flag(self, name: str, default: bool = False) -> bool:
        """The boolean variable ``name`` (``environment.flag`` on the effective variables)."""
        return env.flag(name, default, self.environ)

    def get_int(self, name: str, default: int | None = None) -> int | None:
        return env.get_int(name, default, self.environ)

    def get_str(self, name: str, default: str | None = None) -> str | None:
        return env.get_str(name, default, self.environ)

    def get_seconds(self, name: str) -> float | None:
        return env.get_seconds(name, self.environ)


def settle(environ: Mapping[str, str]) -> RunSettings:
    """The run's settings from ``environ`` (usually ``os.environ``), which is only read.

    Raises ``AccelerateLaunchError`` for an ``accelerate launch`` setting accel cannot honour and ValueError for a
    launcher's variable it cannot read: in every process alike (they share the launcher's variables), before any
    of them communicates.
    """
    effective = dict(environ)
    from_accelerate = accelerate_launch_env.variables(effective)
    effective.update(from_accelerate)
    job = cluster_env.detect(effective)
    from_cluster = cluster_env.torchrun_variables(job, effective)
    effective.update(from_cluster)
    return RunSettings(FrozenEnviron(effective), job, FrozenEnviron({**from_accelerate, **from_cluster}))


def settle_environment() -> RunSettings:
    """``settle(os.environ)``, for an entry that has no Accelerator's record to read: a script's own
    ``DeepSpeedStrategy()`` / ``MegatronStrategy()`` or ``DeepSpeedPlugin.from_env()``. The backend settles once there
    and passes the record down, so its code reads the record (with ``accelerate launch``'s and a cluster launcher's
    variables translated, as the Accelerator's), never ``os.environ``."""
    return settle(os.environ)
