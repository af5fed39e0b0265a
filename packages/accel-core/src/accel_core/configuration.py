"""Configuration dataclasses the Accelerator accepts: plugins and kwargs handlers.

Configuration is data: these hold settings and convert them, nothing here starts processes.
Torch is imported lazily inside the methods that need it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class KwargsHandler:
    """Base of the kwargs handlers: ``to_kwargs()`` returns only the fields changed from their default."""

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from their default, as keyword arguments."""
        default = self.__class__()
        handler = cast("DataclassInstance", self)  # every handler is a dataclass subclass
        return {
            f.name: getattr(self, f.name) for f in fields(handler) if getattr(self, f.name) != getattr(default, f.name)
        }


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments passed to ``torch.nn.parallel.DistributedDataParallel``, and its communication hook.

    comm_hook: a ``DDPCommunicationHookType`` (or its value): ``"fp16"`` / ``"bf16"`` send gradients
        compressed to that dtype, ``"power_sgd"`` / ``"batched_power_sgd"`` low-rank approximations
        (torch's ``ddp_comm_hooks``). Registered on the model when it is prepared.
    comm_wrapper: ``"fp16"`` or ``"bf16"``: also compress what ``comm_hook`` sends (power-SGD's factors).
    comm_state_option: keyword arguments of power-SGD's ``PowerSGDState`` (``matrix_approximation_rank``,
        ``start_powerSGD_iter``, ...).

    Example: ``Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])``
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: Any = "no"
    comm_wrapper: Any = "no"
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from .enums import DDPCommunicationHookType

        for name in ("comm_hook", "comm_wrapper"):
            value = getattr(self, name)
            try:
                setattr(self, name, DDPCommunicationHookType(str(getattr(value, "value", value)).lower()))
            except ValueError:
                raise ValueError(
                    f"{name}={value!r} is not a DDPCommunicationHookType: use one of {DDPCommunicationHookType.list()}."
                ) from None
        hook: DDPCommunicationHookType = self.comm_hook
        wrapper: DDPCommunicationHookType = self.comm_wrapper
        if wrapper not in ("no", "fp16", "bf16"):
            raise ValueError(f"comm_wrapper={wrapper.value!r}: a wrapper compresses to 'fp16' or 'bf16' (or 'no').")
        if wrapper != "no" and hook == "no":
            raise ValueError(f"comm_wrapper={wrapper.value!r} wraps a comm_hook: set comm_hook too (e.g. 'power_sgd').")
        if self.comm_state_option and hook not in ("power_sgd", "batched_power_sgd"):
            raise ValueError(
                "comm_state_option configures power-SGD: set comm_hook='power_sgd' or 'batched_power_sgd'."
            )

    def to_kwargs(self) -> dict[str, Any]:
        """The ``DistributedDataParallel`` arguments (the hook settings are applied after wrapping)."""
        kwargs = super().to_kwargs()
        for name in ("comm_hook", "comm_wrapper", "comm_state_option"):
            kwargs.pop(name, None)
        return kwargs


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments of ``torch.amp.GradScaler`` used for fp16."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments of ``torch.distributed.init_process_group`` (backend and timeout), and when to report a stall.

    timeout: how long a collective waits for every rank before it fails (``accel launch
        --collective-timeout`` when left at torch's 30 minutes).
    stall_report_after: seconds (or a ``timedelta``) a rank waits in one of accel's collectives before
        it prints which ranks have not reached it and where they are, once, without stopping the job
        (``accel_core.stall_report``); 0 turns the report off. Default: ``ACCEL_STALL_REPORT_AFTER``
        (``accel launch --stall-report-after``), else 60 s. Not an argument of ``init_process_group``.
    """

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta = field(default_factory=lambda: timedelta(seconds=1800))
    stall_report_after: float | timedelta | None = None

    def to_kwargs(self) -> dict[str, Any]:
        """The changed fields, and ``timeout`` always."""
        kwargs = super().to_kwargs()
        kwargs["timeout"] = self.timeout  # always pass it: the point of this handler
        return kwargs


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments of ``torch.autocast`` (``enabled=False`` turns it off inside a block)."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class ProfileKwargs(KwargsHandler):
    """Settings of ``torch.profiler.profile`` for ``Accelerator.profile()``.

    activities: names among ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"hpu"``, ``"mtia"`` (default: torch's choice).
    schedule_option: arguments of ``torch.profiler.schedule`` (``wait``, ``warmup``, ``active``, ``repeat``,
        ``skip_first``); call ``prof.step()`` once per iteration then.
    on_trace_ready: called with the profiler whenever a scheduled recording ends.
    output_trace_dir: each process writes its Chrome trace there as ``profile_<process index>.json``.

    Example::

        handler = ProfileKwargs(activities=["cpu"], record_shapes=True, output_trace_dir="traces")
        accelerator = Accelerator(kwargs_handlers=[handler])
        with accelerator.profile() as prof:
            train_step()
        print(prof.key_averages().table())
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Any = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> Any:
        """A ``torch.profiler.profile`` with these settings (not started)."""
        import torch

        known = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "hpu": "HPU", "mtia": "MTIA"}
        activities = None
        if self.activities is not None:
            activities = []
            for name in self.activities:
                member = getattr(torch.profiler.ProfilerActivity, known.get(str(name).lower(), ""), None)
                if member is None:
                    available = [n for n, m in known.items() if hasattr(torch.profiler.ProfilerActivity, m)]
                    raise ValueError(f"Invalid profiler activity: {name}. Must be one of {available}.")
                activities.append(member)
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option is not None else None
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    """How ``prepare`` compiles models with ``torch.compile`` (``Accelerator(dynamo_plugin=...)``).

    backend: a ``DynamoBackend`` name (``"inductor"``, ...); ``None`` reads ``ACCEL_DYNAMO_BACKEND``, else ``"no"``.
    mode / fullgraph / dynamic / options / disable: ``torch.compile``'s arguments (``None``: ``ACCEL_DYNAMO_MODE``,
        ``ACCEL_DYNAMO_USE_FULLGRAPH``, ``ACCEL_DYNAMO_USE_DYNAMIC`` where set, else torch's default).
    use_regional_compilation: compile each block of a repeated stack (an ``nn.ModuleList`` of one
        class) on its own, so the compiler's cache serves the others: a faster cold start.

    Example::

        accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="inductor", mode="reduce-overhead"))
    """

    backend: Any = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        from . import environment as env
        from .enums import DynamoBackend

        backend = self.backend if self.backend is not None else env.get_str(env.DYNAMO_BACKEND, "no")
        name = str(getattr(backend, "value", backend)).lower()
        if name not in DynamoBackend.list():
            raise ValueError(f"Unknown dynamo backend {backend!r}. Choose between {DynamoBackend.list()}.")
        self.backend = DynamoBackend(name)
        # Unset fields read the launcher's variables (accel launch --dynamo_mode ..., as Accelerate's plugin does).
        if self.mode is None:
            self.mode = env.get_str(env.DYNAMO_MODE)
        if self.fullgraph is None and env.get_str(env.DYNAMO_USE_FULLGRAPH) is not None:
            self.fullgraph = env.flag(env.DYNAMO_USE_FULLGRAPH)
        if self.dynamic is None and env.get_str(env.DYNAMO_USE_DYNAMIC) is not None:
            self.dynamic = env.flag(env.DYNAMO_USE_DYNAMIC)
        if self.use_regional_compilation is None:
            self.use_regional_compilation = env.flag(env.DYNAMO_USE_REGIONAL_COMPILATION)

    def to_kwargs(self) -> dict[str, Any]:
        """``torch.compile``'s keyword arguments: the backend and the fields set."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        kwargs.pop("use_regional_compilation")
        if not kwargs["disable"]:
            kwargs.pop("disable")
        kwargs["backend"] = self.backend.value
        return kwargs


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradient accumulation behaves.

    num_steps: micro-batches per optimizer step.
    adjust_scheduler: kept for API compatibility. As in Accelerate, the LR scheduler never steps on
        accumulation micro-steps whatever its value (Accelerate reads the field so that it never takes
        effect), so a schedule is written in optimizer steps times the stepping of ``scheduler_stepping``.
    sync_with_dataloader: force a sync (and an optimizer step) on the last batch of the data.
    sync_each_batch: synchronise gradients on every micro-batch (saves memory with FSDP, costs speed).
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"gradient accumulation num_steps must be an integer >= 1, got {self.num_steps!r}.")


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards dataloaders (read by accel-data).

    split_batches: the loader's batch is the global batch, split between processes (its size must
        divide by the number of processes); otherwise each process gets a batch of that size.
    dispatch_batches: process 0 reads the data and sends each process its slice. ``None`` means
        off: accel shards iterable datasets per process too (Accelerate forces dispatch there).
    even_batches: pad the last global batch with samples from the start so every process gets the
        same number of batches (``gather_for_metrics`` drops the padding again).
    use_seedable_sampler: shuffle with a sampler seeded by ``data_seed`` + epoch, identical on every
        process and across resumes.
    non_blocking: copy batches to the device with ``non_blocking=True`` (needs ``pin_memory``).
    use_stateful_dataloader: build the loader on torchdata's ``StatefulDataLoader``.
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class ProjectConfiguration:
    """Where a run writes logs and checkpoints.

    It lives in core because both the trackers (``logging_dir``) and the checkpoint package read it.

    automatic_checkpoint_naming: ``save_state()`` writes ``<project_dir>/checkpoints/checkpoint_<n>``.
    total_limit: keep at most this many automatic checkpoints (oldest deleted after a new one is complete).
    iteration: number of the next automatic checkpoint.
    save_on_each_node: write node-local files on every machine, not only the main one.
    save_every_n_steps: the Accelerator calls ``save_state()`` itself after every N optimizer steps
        (accumulation micro-steps do not count), when the training loop asks its prepared
        dataloader for the next batch: the step, its scheduler step and its logging are done by then.
        Needs ``automatic_checkpoint_naming``; ``total_limit`` keeps the folder bounded. Together with
        ``Accelerator(resume="auto")`` a restarted job resumes from the newest of these checkpoints.
    save_async: the periodic saves return once the state is in CPU memory (``save_state(async_save=True)``).
    checkpoint_on_sigterm: a SIGTERM (a cluster's preemption notice; torchrun's agent forwards it to every
        worker and kills 30 s later) makes every process save an automatic checkpoint at the end of the
        current optimizer step and exit with 143; ``resume="auto"`` continues from it. The processes
        agree through one all_reduce of a flag per optimizer step (the only cost), as the signal may
        reach some of them only. The Accelerator must be created in the main thread.

    Example::

        ProjectConfiguration(project_dir="runs/exp", automatic_checkpoint_naming=True, total_limit=2,
                             save_every_n_steps=100)
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False
    save_every_n_steps: int | None = None
    save_async: bool = False
    checkpoint_on_sigterm: bool = False

    def __post_init__(self) -> None:
        if self.project_dir is not None:
            self.project_dir = os.fspath(self.project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        else:
            self.logging_dir = os.fspath(self.logging_dir)
        if self.total_limit is not None and self.total_limit < 1:
            raise ValueError(f"total_limit must be >= 1 or None, got {self.total_limit}.")
        every = self.save_every_n_steps
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
            raise ValueError(f"save_every_n_steps must be an integer >= 1 or None, got {every!r}.")

    def set_directories(self, project_dir: str | os.PathLike[str] | None = None) -> None:
        """Sets ``project_dir`` and, when it was not chosen separately, ``logging_dir``."""
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
