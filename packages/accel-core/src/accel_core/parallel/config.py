"""``ParallelismConfig``: how the processes of a job are laid out on one named device mesh. No torch.

Every process belongs to one point of a mesh whose dimensions are, outermost first, ``pp``
(pipeline stages), ``dp_replicate`` (model replicas), ``dp_shard`` (FSDP shards), ``cp`` (context
parallel: sequence chunks) and ``tp`` (tensor parallel). Their sizes multiply to the number of
processes. Data parallelism is ``dp = dp_replicate x dp_shard``: processes that differ only in
``cp`` / ``tp`` (/ ``pp``) read the same batch. The Accelerator builds the mesh (``accel_core.parallel.dims``)
with flattened views ``dp``, ``dp_shard_cp`` and ``dp_cp``.

Resolution (``resolve_parallelism``) is a pure function: each size comes from the argument, else
from its ``ACCEL_*`` variable (``accel launch --tp-size 2`` or the config file's ``tp_size: 2``),
else 1 — except the strategy's data-parallel dimension (``dp_shard`` for FSDP, ``dp_replicate``
otherwise), which takes the processes left over.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import environment as env

# Mesh dimensions, outermost first (torchtitan's order): tp innermost, so that tensor-parallel
# peers are neighbouring ranks (the same machine), and pipeline stages outermost.
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
SIZE_FIELDS = tuple(f"{name}_size" for name in MESH_DIMS)
ENV_VARS = {f"{name}_size": f"ACCEL_{name.upper()}_SIZE" for name in MESH_DIMS}
CP_COMM_STRATEGIES = ("allgather", "alltoall")
CP_BACKENDS = ("torch",)  # Accelerate 1.15's choices (and default first)
SP_BACKENDS = ("deepspeed",)
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


@dataclass
class ParallelismConfig:
    """The parallel layout of the job: sizes of the mesh dimensions and how tensor parallelism splits the model.

    Sizes left ``None`` are read from ``ACCEL_<DIM>_SIZE`` (``accel launch --tp-size`` ...), else
    1, except the data-parallel one, which fills the remaining processes. The product must equal
    the number of processes.

    dp_replicate_size: model replicas (DDP; with ``dp_shard_size > 1``, HSDP's replicas).
    dp_shard_size: FSDP2 shards of each replica (needs accel-fsdp).
    tp_size: tensor-parallel degree (``torch.distributed.tensor.parallel``).
    cp_size: context-parallel degree: each process holds ``1/cp`` of every sequence (needs FSDP2
        and a GPU: torch shards only its GPU attention kernels).
    pp_size: pipeline stages (``torch.distributed.pipelining``; see ``accel_core.pipelining``): the
        model is split into stages, each rank keeps its stage(s), and training steps go through
        ``accelerator.forward_backward``.
    pp_schedule: ``"gpipe"``, ``"1f1b"`` (default) or ``"interleaved_1f1b"`` (``ACCEL_PP_SCHEDULE``).
    pp_microbatches: micro-batches each batch is split into (``ACCEL_PP_MICROBATCHES``; default:
        the number of stages, ``pp_size x pp_stages_per_rank``).
    pp_stages_per_rank: virtual stages per rank (default 2 for ``interleaved_1f1b``, else 1).
    pp_split_points: names of the modules where a new stage begins (``["layers.4", "layers.8"]``
        for 3 stages), like ``SplitPoint.BEGINNING``; default: the model's blocks split evenly.
    tp_plan: ``{module-name pattern: style}`` for ``parallelize_module``: a ``ParallelStyle``
        (``ColwiseParallel()``, ``RowwiseParallel()``, ``SequenceParallel()``) or one of the
        names ``"colwise"``, ``"rowwise"``, ``"sequence_parallel"``; ``*`` matches one name part
        (``"layers.*.attention.wq"``). Default: the model's own ``tp_plan`` attribute, or its
        ``parallelize(mesh)`` method.
    parallelize_fn: ``fn(model, tp_mesh)`` applying tensor parallelism yourself (full control);
        returns the model (or None: changed in place).
    activation_checkpointing: recompute each block's activations in backward (blocks: the
        classes in the model's ``_no_split_modules``, or the FSDP plugin's units).
    cp_comm_strategy: how context-parallel attention exchanges keys/values: ``allgather`` or ``alltoall``.
    cp_backend: who implements context parallelism: ``"torch"`` (the default and only choice, as in
        Accelerate 1.15: torch's context-parallel attention).
    sp_size, sp_backend: Accelerate's sequence parallelism (DeepSpeed Ulysses, ``sp_backend="deepspeed"``,
        the default). accel does not run it: ``sp_size`` must stay 1 (default); ``cp_size`` splits
        sequences with torch instead. Frameworks read ``sp_enabled`` / ``sp_size`` / ``sp_backend``.

    Example::

        config = ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan={
            "layers.*.attention.wq": "colwise", "layers.*.attention.wo": "rowwise"})
        accelerator = Accelerator(parallelism_config=config)   # 4 processes: FSDP2 x TP
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    pp_size: int | None = None
    tp_plan: Mapping[str, Any] | None = None
    parallelize_fn: Callable[..., Any] | None = field(default=None, repr=False)
    activation_checkpointing: bool = False
    cp_comm_strategy: str = "allgather"
    pp_schedule: str | None = None
    pp_microbatches: int | None = None
    pp_stages_per_rank: int | None = None
    pp_split_points: Sequence[str] | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None

    def __post_init__(self) -> None:
        self._check_sequence_fields()
        for name in SIZE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelismConfig.{name} must be an integer >= 1, got {value!r}.")
        for name in ("pp_microbatches", "pp_stages_per_rank"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"ParallelismConfig.{name} must be an integer >= 1, got {value!r}.")
        if self.pp_schedule is not None and self.pp_schedule.lower() not in PP_SCHEDULES:
            raise ValueError(f"pp_schedule must be one of {PP_SCHEDULES}, got {self.pp_schedule!r}.")
        if isinstance(self.pp_split_points, str):
            raise TypeError("pp_split_points is a list of module names, e.g. ['layers.4']; got one string.")
        if self.cp_comm_strategy not in CP_COMM_STRATEGIES:
            raise ValueError(f"cp_comm_strategy must be one of {CP_COMM_STRATEGIES}, got {self.cp_comm_strategy!r}.")
        if self.tp_plan is not None and self.parallelize_fn is not None:
            raise ValueError(
                "Pass either tp_plan or parallelize_fn, not both: parallelize_fn applies tensor parallelism itself."
            )

    def _check_sequence_fields(self) -> None:
        """Fills the context/sequence-parallel settings with Accelerate 1.15's defaults and refuses what accel cannot
        run (DeepSpeed's Ulysses sequence parallelism)."""
        if self.cp_backend is None:
            self.cp_backend = CP_BACKENDS[0]
        if self.cp_backend not in CP_BACKENDS:
            raise ValueError(f"cp_backend must be one of {list(CP_BACKENDS)}, but got {self.cp_backend!r}.")
        if self.sp_backend is None:
            self.sp_backend = SP_BACKENDS[0]
        if self.sp_backend not in SP_BACKENDS:
            raise ValueError(f"sp_backend must be one of {list(SP_BACKENDS)}, but got {self.sp_backend!r}.")
        if self.sp_size is None:
            self.sp_size = 1
        if isinstance(self.sp_size, bool) or not isinstance(self.sp_size, int) or self.sp_size < 1:
            raise ValueError(f"sp_size must be an integer >= 1, but got {self.sp_size!r}.")
        if self.sp_size > 1:
            raise ValueError(
                f"sp_size={self.sp_size} asks for DeepSpeed's Ulysses sequence parallelism (sp_backend="
                f"{self.sp_backend!r}), which accel does not run. Use cp_size={self.sp_size} (torch context "
                "parallelism under FSDP2: each process holds 1/cp of every sequence), or sp_size=1."
            )

    @property
    def sp_enabled(self) -> bool:
        """Whether sequence parallelism is on (``sp_size > 1``; always False on accel, which refuses it)."""
        return (self.sp_size or 1) > 1

    # -- sizes (None counts as 1 until resolved) ------------------------------------------------
    def size(self, dim: str) -> int:
        """The size of mesh dimension ``dim`` (1 when unset)."""
        value = getattr(self, f"{dim}_size")
        return 1 if value is None else int(value)

    @property
    def sizes(self) -> dict[str, int]:
        """Every mesh dimension's size, ``{"dp_replicate": ..., "dp_shard": ..., "cp": ..., "tp": ..., "pp": ...}``."""
        return {dim: self.size(dim) for dim in MESH_DIMS}

    @property
    def total_size(self) -> int:
        """The product of the sizes: the number of processes this layout needs."""
        return math.prod(self.sizes.values())

    @property
    def data_parallel_size(self) -> int:
        """Processes that read different batches: ``dp_replicate x dp_shard``."""
        return self.size("dp_replicate") * self.size("dp_shard")

    @property
    def non_data_parallel_size(self) -> int:
        """``tp x cp x pp``: the processes that share one data-parallel rank (and read the same batch)."""
        return self.size("tp") * self.size("cp") * self.size("pp")

    @property
    def dp_replicate_enabled(self) -> bool:
        """Whether there are several model replicas (``dp_replicate_size > 1``)."""
        return self.size("dp_replicate") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """Whether parameters are sharded (``dp_shard_size > 1``: FSDP2)."""
        return self.size("dp_shard") > 1

    @property
    def tp_enabled(self) -> bool:
        """Whether tensor parallelism is on (``tp_size > 1``)."""
        return self.size("tp") > 1

    @property
    def cp_enabled(self) -> bool:
        """Whether context parallelism is on (``cp_size > 1``)."""
        return self.size("cp") > 1

    @property
    def pp_enabled(self) -> bool:
        """Whether pipeline parallelism is asked for (``pp_size > 1``)."""
        return self.size("pp") > 1

    # -- names of the reference's mesh views ----------------------------------------------------
    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions data is sharded over."""
        return [d for d in ("dp_replicate", "dp_shard") if self.size(d) > 1]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose processes read the same batch."""
        return [d for d in ("tp", "cp") if self.size(d) > 1]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions FSDP shards parameters over."""
        return [d for d in ("dp_shard", "cp") if self.size(d) > 1]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions a loss is averaged over."""
        return [d for d in ("dp_replicate", "dp_shard", "cp") if self.size(d) > 1]

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP2 shards over: ``["dp_replicate", "dp_shard_cp"]`` with replicas (HSDP), else
        ``["dp_shard_cp"]``."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        """The data-parallel, then the other, dimension names of the mesh, in mesh order."""
        return self.dp_dim_names + self.non_dp_dim_names

    def describe(self) -> str:
        """``dp_replicate=2 x dp_shard=2 x tp=1 ...`` for messages."""
        return " x ".join(f"{dim}={self.size(dim)}" for dim in MESH_DIMS)


def requested_size(config: ParallelismConfig | None, dim: str, environ: Mapping[str, str] | None = None) -> int:
    """The size asked for ``dim`` by the argument, else its ``ACCEL_*`` variable, else 1 (nothing filled)."""
    value = getattr(config, f"{dim}_size") if config is not None else None
    if value is None:
        value = env.get_int(ENV_VARS[f"{dim}_size"], None, environ)
    return 1 if value is None else int(value)


def resolve_parallelism(
    config: ParallelismConfig | None,
    world_size: int,
    *,
    data_parallel_dim: str = "dp_replicate",
    environ: Mapping[str, str] | None = None,
) -> ParallelismConfig:
    """A copy of ``config`` with every size set, checked against ``world_size``; raises ValueError with the fix.

    data_parallel_dim: the dimension that takes the processes no size claims (``dp_shard`` for
        FSDP, ``dp_replicate`` otherwise), unless both data-parallel sizes are given.

    Example::

        resolve_parallelism(ParallelismConfig(tp_size=2), 8).dp_replicate_size   # 4
    """
    config = config if config is not None else ParallelismConfig()
    if data_parallel_dim not in ("dp_replicate", "dp_shard"):
        raise ValueError(f"data_parallel_dim must be dp_replicate or dp_shard, got {data_parallel_dim!r}.")
    given: dict[str, int | None] = {}
    for name in SIZE_FIELDS:
        value = getattr(config, name)
        if value is None:
            value = env.get_int(ENV_VARS[name], None, environ)
            if value is not None and value < 1:
                raise ValueError(f"Environment variable {ENV_VARS[name]}={value}: a mesh size must be >= 1.")
        given[name] = value
    claimed = math.prod(v for v in given.values() if v is not None)
    open_dims = [
        name for name, value in given.items() if value is None and name in ("dp_replicate_size", "dp_shard_size")
    ]
    sizes = {name: value for name, value in given.items()}
    described = ", ".join(f"{n}={v}" for n, v in given.items() if v is not None) or "no sizes"
    if world_size % claimed:
        raise ValueError(
            f"ParallelismConfig: {described} need a multiple of {claimed} processes, but the job has {world_size}. "
            f"Choose sizes whose product is {world_size}."
        )
    rest = world_size // claimed
    if len(open_dims) == 2:
        target = f"{data_parallel_dim}_size"
        other = "dp_shard_size" if target == "dp_replicate_size" else "dp_replicate_size"
        sizes[target], sizes[other] = rest, 1
    elif len(open_dims) == 1:
        sizes[open_dims[0]] = rest
    elif rest != 1:
        raise ValueError(
            f"ParallelismConfig: {described} multiply to {claimed}, but the job has {world_size} processes. "
            f"Make the product {world_size} (or leave a data-parallel size unset to fill the rest)."
        )
    for name in SIZE_FIELDS:
        if sizes[name] is None:
            sizes[name] = 1
    return replace(config, **sizes, **_pipeline_settings(config, environ))


def _pipeline_settings(config: ParallelismConfig, environ: Mapping[str, str] | None) -> dict[str, Any]:
    """The schedule and micro-batch count from the argument, else ``ACCEL_PP_SCHEDULE`` / ``ACCEL_PP_MICROBATCHES``."""
    schedule = config.pp_schedule or env.get_str("ACCEL_PP_SCHEDULE", None, environ)
    if schedule is not None and schedule.lower() not in PP_SCHEDULES:
        raise ValueError(f"ACCEL_PP_SCHEDULE={schedule!r}: use one of {', '.join(PP_SCHEDULES)}.")
    microbatches = config.pp_microbatches
    if microbatches is None:
        microbatches = env.get_int("ACCEL_PP_MICROBATCHES", None, environ)
        if microbatches is not None and microbatches < 1:
            raise ValueError(f"ACCEL_PP_MICROBATCHES={microbatches}: the number of micro-batches must be >= 1.")
    schedule = schedule.lower() if schedule else None
    if schedule in ("gpipe", "1f1b") and (config.pp_stages_per_rank or 1) > 1:
        raise ValueError(
            f"pp_schedule={schedule!r} runs one stage per rank, but pp_stages_per_rank={config.pp_stages_per_rank}: "
            "use pp_schedule='interleaved_1f1b' for several virtual stages per rank."
        )
    return {"pp_schedule": schedule, "pp_microbatches": microbatches}


def config_from_sizes(**sizes: int) -> ParallelismConfig:
    """A resolved config from sizes (missing ones are 1): ``config_from_sizes(dp_shard=2, tp=2)``."""
    unknown = set(sizes) - set(MESH_DIMS)
    if unknown:
        raise ValueError(f"Unknown mesh dimension(s) {sorted(unknown)}; known: {', '.join(MESH_DIMS)}.")
    given: dict[str, Any] = {f"{dim}_size": sizes.get(dim, 1) for dim in MESH_DIMS}
    return ParallelismConfig(**given)
