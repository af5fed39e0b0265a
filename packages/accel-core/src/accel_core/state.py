"""Process state shared by everything in one process: who am I, how many are we, which device.

``PartialState`` is created once per process (later instances share the first one's state, so any
module can ask ``PartialState().process_index`` cheaply). ``AcceleratorState`` adds what the
``Accelerator`` decided (precision, strategy); ``GradientState`` tracks accumulation and the end of
the data.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import partial, wraps
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from . import cluster_env
from . import environment as env
from .attempt_store import attempt_store
from .configuration import GradientAccumulationPlugin
from .enums import DistributedType
from .placement import Collectives, ProcessPlacement
from .stall_report import start_watch, watched


def _pick_device(cpu: bool, local_rank: int, world_size: int) -> torch.device:
    if cpu:
        return torch.device("cpu")
    for kind in ("cuda", "xpu"):
        backend = getattr(torch, kind, None)
        if backend is not None and backend.is_available():
            count = backend.device_count()
            if count == 1:
                # One device visible: a launcher bound one to each process (SLURM --gpus-per-task=1 or
                # --gpu-bind, a CUDA_VISIBLE_DEVICES per rank), or a one-device machine. Either way it is
                # this process's (several processes sharing it is NCCL's "Duplicate GPU" error).
                return torch.device(kind, 0)
            if local_rank >= count:
                raise ValueError(
                    f"Process with local rank {local_rank} has no {kind} device of its own: this machine has "
                    f"{count}. Start at most that many processes per machine, or pass --cpu."
                )
            return torch.device(kind, local_rank)
    # MPS is a single device: several processes cannot share it.
    if world_size == 1 and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _destroy_gloo_groups_before_finalization() -> None:
    # A gloo group still alive when the interpreter finalizes can hold tensors on its worker
    # threads; freeing them then needs the GIL of a dying interpreter and the process aborts
    # (SIGABRT, "terminate called without an active exception") after the script succeeded.
    # Destroying the groups while Python is still whole avoids it; it is a local operation.
    # Still needed now that the process state no longer holds the strategy: the groups are kept
    # alive by torch.distributed's own module state (the default group and every subgroup, the
    # mesh's included), not by anything accel holds, so nothing accel drops can free them earlier.
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # exiting anyway; never turn a clean exit into an error
            dist.destroy_process_group()


DEFAULT_COLLECTIVE_TIMEOUT = timedelta(minutes=30)


def collective_timeout(given: timedelta | None = None) -> timedelta:
    """How long a collective waits for every rank before it fails: the process group's ``timeout``.

    A timeout the script gave (``InitProcessGroupKwargs(timeout=...)``) wins, then
    ``ACCEL_COLLECTIVE_TIMEOUT`` (seconds; ``accel launch --collective-timeout``), then 30 minutes.
    ``InitProcessGroupKwargs``'s own default (30 minutes) counts as not given.
    """
    if given is not None and given != DEFAULT_COLLECTIVE_TIMEOUT:
        return given
    seconds = env.get_seconds(env.COLLECTIVE_TIMEOUT)
    return timedelta(seconds=seconds) if seconds is not None else DEFAULT_COLLECTIVE_TIMEOUT


def default_backend(device: torch.device) -> str:
    """The collective backend for ``device``: nccl for CUDA, xccl for XPU, gloo otherwise."""
    return {"cuda": "nccl", "xpu": "xccl"}.get(device.type, "gloo")


class PartialState:
    """The process's place in the job, without anything the Accelerator adds.

    Reads torchrun's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` and initialises the default process
    group once when there is more than one process. ``cpu=True`` (or ``ACCEL_USE_CPU=true``) forces
    the CPU and gloo.

    Example::

        state = PartialState()
        with state.main_process_first():
            download_data()
    """

    _shared_state: ClassVar[dict[str, Any]] = {}
    _resets: ClassVar[int] = 0  # resets of the shared state so far (an Accelerator made before one refuses work)
    # What every complete state has, and the properties reading it: after a reset, each raises an
    # AttributeError that names the reset (a property's AttributeError ends in __getattr__).
    _known_attrs: ClassVar[frozenset[str]] = frozenset(
        {"world_size", "rank", "local_rank", "local_world_size", "cpu", "debug", "device", "backend"}
        | {"num_processes", "process_index", "local_process_index", "use_distributed", "distributed_type"}
        | {"is_main_process", "is_local_main_process", "is_last_process"}
    )

    def __init__(
        self, cpu: bool = False, placement: ProcessPlacement | None = None, **init_process_group_kwargs: Any
    ) -> None:
        self.__dict__ = self._shared_state
        if "device" in self._shared_state:
            return
        # Not an argument of init_process_group: when this process reports a collective that waits too long.
        stall_after = init_process_group_kwargs.pop("stall_report_after", None)
        if placement is not None:
            self._take_placement(placement, cpu)
            self._watch_stalls(stall_after, init_process_group_kwargs.get("timeout"))
            return
        cluster_env.adopt()  # started by srun / mpirun / a PyTorchJob: their variables as torchrun's
        self.world_size = env.get_int(env.WORLD_SIZE, 1) or 1
        self.rank = env.get_int(env.RANK, 0) or 0
        self.local_rank = env.get_int(env.LOCAL_RANK, 0) or 0
        self.local_world_size = env.get_int(env.LOCAL_WORLD_SIZE, self.world_size) or self.world_size
        self.cpu = bool(cpu) or env.flag(env.USE_CPU)
        self.debug = env.flag(env.DEBUG_MODE)
        self.device = _pick_device(self.cpu, self.local_rank, self.world_size)
        self.backend: str | None = None
        if self.world_size > 1 or dist.is_initialized():
            self._init_process_group(init_process_group_kwargs)
            if "gloo" in str(self.backend):
                atexit.register(_destroy_gloo_groups_before_finalization)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.fork_launched = False
        self._watch_stalls(stall_after, init_process_group_kwargs.get("timeout"))

    def _watch_stalls(self, stall_after: float | timedelta | None, timeout: timedelta | None) -> None:
        # The stall report's thread (accel_core.stall_report): a daemon that costs the steps nothing.
        start_watch(self.rank, self.world_size, stall_after, collective_timeout(timeout).total_seconds())

    def _take_placement(self, placement: ProcessPlacement, cpu: bool) -> None:
        # The backend's runtime joined the processes already (its strategy's init_process_group).
        self.world_size = placement.world_size
        self.rank = placement.rank
        self.local_rank = placement.local_rank
        self.local_world_size = placement.local_world_size
        self.cpu = bool(cpu)
        self.debug = env.flag(env.DEBUG_MODE)
        self.backend = placement.backend
        self._shared_state["collectives"] = placement.collectives
        self.fork_launched = False
        self.device = placement.device  # last: `initialized` means complete

    def _init_process_group(self, kwargs: dict[str, Any]) -> None:
        if dist.is_initialized():
            # Someone (the user, a backend) already joined: adopt its group.
            self.backend = dist.get_backend()
            self.world_size = dist.get_world_size()
            self.rank = dist.get_rank()
            return
        kwargs = dict(kwargs)
        if self.debug and not os.environ.get(env.TORCH_DISTRIBUTED_DEBUG):
            # Debug mode under plain torchrun: torch read the variable when it was imported, so set
            # it and make torch read it again before the group (and its checking wrapper) is made.
            os.environ[env.TORCH_DISTRIBUTED_DEBUG] = "DETAIL"
            dist.set_debug_level_from_env()
        backend = kwargs.pop("backend", None) or default_backend(self.device)
        kwargs["timeout"] = collective_timeout(kwargs.get("timeout"))
        if backend == "nccl" and self.device.type == "cuda":
            # device_id binds the default group to this GPU: NCCL connects it now (a network problem fails here,
            # not at the first collective) and later groups are split from it. The cost: every group made after
            # (the mesh's and its flattened views, a backend's own) connects as it is made, each with its GPU
            # buffers, used or not. Kept until bench/gpu_lane.py's process_groups_* cases have measured both ways on
            # a many-GPU node; a script that wants lazy groups calls dist.init_process_group("nccl") first (adopted).
            kwargs.setdefault("device_id", self.device)
        if kwargs.get("init_method") is None and kwargs.get("store") is None:
            store = attempt_store(self.world_size, kwargs["timeout"])
            if store is not None:  # the agent's store outlives the attempt: keys of this attempt only
                kwargs.update(store=store, rank=self.rank, world_size=self.world_size)
        dist.init_process_group(backend=backend, **{k: v for k, v in kwargs.items() if v is not None})
        self.backend = backend

    # -- identity ---------------------------------------------------------------------------
    @property
    def collectives(self) -> Collectives | None:
        """The backend's collectives when its runtime placed the process (``accel_core.placement``), else None:
        ``accel_core.ops`` then uses torch.distributed."""
        return self._shared_state.get("collectives")

    @property
    def initialized(self) -> bool:
        """Whether the process state has been set up in this process."""
        return "device" in self._shared_state

    @classmethod
    def is_initialized(cls) -> bool:
        """Whether ``PartialState()`` (or an ``Accelerator``) has set up this process's state, asked without
        setting it up: ``PartialState()`` itself would (and would join the process group)."""
        return "device" in cls._shared_state

    @property
    def num_processes(self) -> int:
        """The number of processes of the job (all machines)."""
        return self.world_size

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return self.rank

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine."""
        return self.local_rank

    @property
    def use_distributed(self) -> bool:
        """Whether the job has more than one process."""
        return self.world_size > 1

    @property
    def distributed_type(self) -> DistributedType:
        """What the Accelerator chose (FSDP, DEEPSPEED, ...) or a script assigned; before that NO for one
        process, else MULTI_CPU / MULTI_GPU / MULTI_XPU by device."""
        chosen = self._shared_state.get("chosen_distributed_type")
        if chosen is not None:
            return chosen
        if not self.use_distributed:
            return DistributedType.NO
        return {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU}.get(
            self.device.type, DistributedType.MULTI_CPU
        )

    @distributed_type.setter
    def distributed_type(self, value: DistributedType | str) -> None:
        # A plain attribute in the reference, which scripts and test suites assign.
        self._shared_state["chosen_distributed_type"] = DistributedType(value)

    @property
    def default_device(self) -> torch.device:
        """The device type this machine offers (``cuda``, ``xpu``, ``mps`` or ``cpu``), without an index
        and whatever ``cpu=True`` says: the reference's ``default_device``."""
        for kind in ("cuda", "xpu"):
            backend = getattr(torch, kind, None)
            if backend is not None and backend.is_available():
                return torch.device(kind)
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")

    def set_device(self) -> None:
        """Makes ``self.device`` the current device of its kind (``torch.cuda.set_device``); a no-op on CPU."""
        if self.device.type in ("cuda", "xpu"):
            getattr(torch, self.device.type).set_device(self.device)

    @property
    def is_main_process(self) -> bool:
        """Whether this is global rank 0."""
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is rank 0 of its machine."""
        return self.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        """Whether this is the last global rank."""
        return self.rank == self.world_size - 1

    # -- synchronisation --------------------------------------------------------------------
    @watched("wait_for_everyone")
    def wait_for_everyone(self) -> None:
        """Blocks until every process reaches this line (a no-op on one process)."""
        if self.collectives is not None:
            self.collectives.barrier("accel.wait_for_everyone")
        elif self.use_distributed:
            dist.barrier()

    @contextlib.contextmanager
    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """The main process runs the block first, then the others (e.g. to download or cache once)."""
        return self._goes_first(self.is_main_process)

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """The first process of each machine runs the block first, then the others."""
        return self._goes_first(self.is_local_main_process)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Gives each process its contiguous share of a list, tuple, dict of lists, tensor, or table.

        The first ``len % num_processes`` processes get one item more. With ``apply_padding`` every
        process gets the same count, the short ones repeating the input's last item (so a later
        ``gather`` has equal shapes; drop the padding yourself). An object with a ``select(rows)``
        method (a ``datasets.Dataset``) gives ``select`` of its share of rows.

        Example::

            with state.split_between_processes(["a", "b", "c"]) as prompts:
                ...  # process 0 gets ["a", "b"], process 1 gets ["c"]
        """
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)

    # -- decorators -------------------------------------------------------------------------
    def _only_if(self, condition: Callable[[], bool], function: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if condition():
                return function(*args, **kwargs)
            return None

        return wrapper

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` on the main process only (others get ``None``)."""
        return self._only_if(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` on the first process of each machine only."""
        return self._only_if(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run ``function`` on the last process only."""
        return self._only_if(lambda: self.is_last_process, function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        """Decorator: run ``function`` on the process with global index ``process_index`` only."""
        if function is None:
            return partial(self.on_process, process_index=process_index)
        if process_index is None:
            raise ValueError("on_process needs process_index=<global rank>.")
        return self._only_if(lambda: self.process_index == process_index, function)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run ``function`` on the process with local index ``local_process_index`` only."""
        if function is None:
            return partial(self.on_local_process, local_process_index=local_process_index)
        if local_process_index is None:
            raise ValueError("on_local_process needs local_process_index=<local rank>.")
        return self._only_if(lambda: self.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the first process of each machine only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self) -> None:
        """Leaves the process group (call at the very end of a script, or between tests)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    @classmethod
    def _reset_state(cls) -> None:
        """Forgets the shared state (tests only; does not leave the process group)."""
        cls._shared_state.clear()
        PartialState._resets += 1

    def __getattr__(self, name: str) -> Any:
        # Only reached for a name the shared state lacks: say why when it is one the state always has.
        if name in self._known_attrs:
            raise AttributeError(
                f"`{type(self).__name__}` object has no attribute `{name}`. This happens if "
                f"`{type(self).__name__}._reset_state()` was called and an `Accelerator` or `PartialState` was not "
                "created again."
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- copies ---------------------------------------------------------------------------
    # The state is one per process: a copy is the same object, and an unpickled one (a DataLoader
    # worker started with spawn, say) is the receiving process's state, filled from the sender's
    # values when that process has none yet (without joining any process group).
    def __reduce__(self) -> tuple[Any, ...]:
        values = {k: v for k, v in self._shared_state.items() if k in _PORTABLE}
        return (_restore_state, (type(self), values))

    def __copy__(self) -> PartialState:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> PartialState:
        return self

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}  Backend: {self.backend}\n"
            f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\nDevice: {self.device}\n"
        )


# What an unpickled state carries over: plain values, never process groups, plugins or objects.
_PORTABLE = frozenset(
    {
        "world_size",
        "rank",
        "local_rank",
        "local_world_size",
        "cpu",
        "debug",
        "device",
        "backend",
        "fork_launched",
        "mixed_precision",
        "chosen_distributed_type",
    }
)


def _restore_state(cls: type[PartialState], values: dict[str, Any]) -> PartialState:
    if not cls._shared_state:
        cls._shared_state.update(values)
    state = cls.__new__(cls)
    state.__dict__ = cls._shared_state
    return state


def _split(inputs: Any, n: int, index: int, apply_padding: bool) -> Any:
    if n == 1:
        return inputs
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("split_between_processes: all values of the dict must have the same length.")
        return {k: _split(v, n, index, apply_padding) for k, v in inputs.items()}
    length = inputs.shape[0] if isinstance(inputs, torch.Tensor) else len(inputs)
    base, extra = divmod(length, n)
    start = index * base + min(index, extra)
    end = start + base + (1 if index < extra else 0)
    wanted = base + (1 if extra else 0)
    select = getattr(inputs, "select", None)
    if callable(select) and not isinstance(inputs, (torch.Tensor, list, tuple, str)):
        # A table with its own row selection (a Hugging Face ``datasets.Dataset``): slicing it
        # gives a dict of columns, so its rows are picked with ``select``.
        rows = list(range(start, end))
        if apply_padding and length > 0:
            rows += [length - 1] * (wanted - len(rows))
        return select(rows)
    share = inputs[start:end]
    if apply_padding and len(share) < wanted and length > 0:
        # Short shares repeat the last item of the input (as Accelerate pads).
        last = inputs[length - 1 : length]
        missing = wanted - len(share)
        if isinstance(share, torch.Tensor) and isinstance(last, torch.Tensor):
            share = torch.cat([share] + [last] * missing)
        else:
            share = type(share)(list(share) + list(last) * missing)
    return share


class AcceleratorState(PartialState):
    """``PartialState`` plus what the Accelerator chose: mixed precision, how the processes train
    together (``distributed_type``) and the backend plugin the reference API exposes here.

    Only plain values are shared: the strategy lives in its Accelerator, not in process state.
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        placement: ProcessPlacement | None = None,
        **init_process_group_kwargs: Any,
    ) -> None:
        super().__init__(cpu=cpu, placement=placement, **init_process_group_kwargs)
        if "mixed_precision" not in self._shared_state or mixed_precision is not None:
            self.mixed_precision = mixed_precision or env.get_str(env.MIXED_PRECISION, "no") or "no"

    @property
    def distributed_type(self) -> DistributedType:
        """What the Accelerator chose (FSDP, DEEPSPEED, ...) or a script assigned, else the process state's."""
        self._chosen("distributed_type")  # raises after a reset
        return super().distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType | str) -> None:
        self._shared_state["chosen_distributed_type"] = DistributedType(value)

    def record_choice(
        self, distributed_type: DistributedType, plugins: dict[str, Any], setup: AcceleratorSetup
    ) -> None:
        """What an Accelerator decided: its distributed type, its backend plugin (``{"fsdp_plugin": p}``) and
        the rest of its setup the reference API reads here."""
        self._shared_state["chosen_distributed_type"] = distributed_type
        self._shared_state["plugins"] = dict(plugins)
        self._shared_state["setup"] = setup

    def _chosen(self, key: str) -> Any:
        if "mixed_precision" not in self._shared_state:  # every AcceleratorState() sets it: gone after a reset
            raise AttributeError(key)  # __getattr__ turns it into the error that names the reset
        return self._shared_state.get(key)

    @property
    def fsdp_plugin(self) -> Any:
        """The ``FullyShardedDataParallelPlugin`` of an FSDP run, else None."""
        return (self._chosen("plugins") or {}).get("fsdp_plugin")

    @property
    def deepspeed_plugin(self) -> Any:
        """The ``DeepSpeedPlugin`` of a DeepSpeed run, else None."""
        return (self._chosen("plugins") or {}).get("deepspeed_plugin")

    @property
    def megatron_lm_plugin(self) -> Any:
        """The ``MegatronLMPlugin`` of a Megatron run, else None."""
        return (self._chosen("plugins") or {}).get("megatron_lm_plugin")

    @property
    def is_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2 (``fully_shard``)."""
        plugin = self.fsdp_plugin
        return self.distributed_type == DistributedType.FSDP and plugin is not None and plugin.fsdp_version == 2

    def _setup(self) -> AcceleratorSetup:
        return self._chosen("setup") or AcceleratorSetup()

    @property
    def deepspeed_plugins(self) -> Any:
        """The DeepSpeed plugin(s) as given to the Accelerator: a dict naming one, or the plugin; None without
        DeepSpeed."""
        return self._setup().deepspeed_plugins

    @property
    def dynamo_plugin(self) -> Any:
        """The Accelerator's ``TorchDynamoPlugin`` (None before an Accelerator exists)."""
        return self._setup().dynamo_plugin

    @property
    def parallelism_config(self) -> Any:
        """The Accelerator's resolved ``ParallelismConfig`` (None before an Accelerator exists)."""
        return self._setup().parallelism_config

    @property
    def device_mesh(self) -> Any:
        """The Accelerator's ``DeviceMesh`` (None for one process, or before an Accelerator exists)."""
        return self._setup().device_mesh

    def _require_deepspeed(self, what: str) -> None:
        if self.distributed_type != DistributedType.DEEPSPEED:
            raise ValueError(f"{what} needs DeepSpeed: create the Accelerator with a DeepSpeedPlugin.")

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed plugin given under ``name`` in ``Accelerator(deepspeed_plugins={name: plugin})``."""
        self._require_deepspeed("get_deepspeed_plugin")
        given = self.deepspeed_plugins
        if not isinstance(given, Mapping):
            raise ValueError(
                f"get_deepspeed_plugin({name!r}): the DeepSpeed plugin was not given a name (deepspeed_plugin=...): "
                "read `state.deepspeed_plugin`."
            )
        if name not in given:
            raise ValueError(f"get_deepspeed_plugin({name!r}): no plugin of that name; given: {sorted(given)}.")
        return given[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Activates the plugin named ``name``. accel runs one DeepSpeed configuration per Accelerator, so
        this accepts only the plugin that is already active."""
        plugin = self.get_deepspeed_plugin(str(name))
        if plugin is not self.deepspeed_plugin:  # pragma: no cover - one plugin per Accelerator (arguments.py)
            raise ValueError(f"select_deepspeed_plugin({name!r}): accel runs one DeepSpeed configuration at a time.")

    @property
    def mixed_precision(self) -> str:
        """The precision the Accelerator runs in: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``."""
        return self._chosen("mixed_precision")

    @mixed_precision.setter
    def mixed_precision(self, value: str) -> None:
        self._shared_state["mixed_precision"] = value

    _known_attrs = PartialState._known_attrs | {
        "mixed_precision",
        "fsdp_plugin",
        "deepspeed_plugin",
        "megatron_lm_plugin",
        "is_fsdp2",
        "deepspeed_plugins",
        "dynamo_plugin",
        "parallelism_config",
        "device_mesh",
    }

    # What AcceleratorState adds to the shared state; the rest is PartialState's.
    _ACCELERATOR_KEYS = ("mixed_precision", "chosen_distributed_type", "plugins", "setup")

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forgets what the Accelerator chose (tests only); the process state (device, process group)
        stays unless ``reset_partial_state``, as in Accelerate. An Accelerator made before the reset
        then refuses to work, with an error that says so."""
        if reset_partial_state:
            PartialState._reset_state()
            return
        for key in cls._ACCELERATOR_KEYS:
            cls._shared_state.pop(key, None)
        PartialState._resets += 1


@dataclass(frozen=True)
class AcceleratorSetup:
    """What an Accelerator set up that the reference API reads from ``AcceleratorState``."""

    dynamo_plugin: Any = None
    parallelism_config: Any = None
    device_mesh: Any = None
    deepspeed_plugins: Any = None


_GRADIENT_SETTINGS = frozenset(
    {"sync_gradients", "num_steps", "sync_with_dataloader", "sync_each_batch", "adjust_scheduler_given"}
)


def _restore_gradient_state(settings: dict[str, Any]) -> GradientState:
    fresh = not GradientState._shared_state
    state = GradientState()
    if fresh:
        state._shared_state.update(settings)
    return state


class GradientState:
    """Gradient accumulation bookkeeping and the prepared dataloaders' end-of-data signal.

    Shared by every instance in the process. A prepared dataloader registers itself while it
    iterates (``register_dataloader`` / ``unregister_dataloader``); the innermost active one answers
    ``end_of_dataloader`` and ``remainder``. Step boundaries (periodic checkpoints) do not pass through
    here: each Accelerator hands its own loaders a ``protocols.BatchBoundaryHook``.
    """

    _shared_state: ClassVar[dict[str, Any]] = {}

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state:
            self.sync_gradients = True
            self.active_dataloader: Any | None = None
            self.dataloader_references: list[Any] = []
            self.num_steps = 1
            self.sync_with_dataloader = True
            self.sync_each_batch = False
            self.adjust_scheduler_given = True
        if gradient_accumulation_plugin is not None:  # a new Accelerator starts a fresh accumulation cycle
            self.sync_gradients = True
            self.num_steps = gradient_accumulation_plugin.num_steps
            self.sync_with_dataloader = gradient_accumulation_plugin.sync_with_dataloader
            self.sync_each_batch = gradient_accumulation_plugin.sync_each_batch
            self.adjust_scheduler_given = gradient_accumulation_plugin.adjust_scheduler

    @property
    def initialized(self) -> bool:
        """Whether the gradient state has been set up in this process."""
        return bool(self._shared_state)

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The accumulation settings that differ from ``GradientAccumulationPlugin``'s defaults (its
        ``to_kwargs()``), as the reference keeps them."""
        return GradientAccumulationPlugin(
            num_steps=self.num_steps,
            adjust_scheduler=self.adjust_scheduler_given,
            sync_with_dataloader=self.sync_with_dataloader,
            sync_each_batch=self.sync_each_batch,
        ).to_kwargs()

    @property
    def adjust_scheduler(self) -> bool:
        """``plugin_kwargs.get("adjust_scheduler", False)``, as the reference reads it: the plugin's default
        (True) is left out of ``plugin_kwargs``, so this is False either way. The scheduler never steps on
        accumulation micro-steps, whatever the plugin says (``GradientAccumulationPlugin``)."""
        return bool(self.plugin_kwargs.get("adjust_scheduler", False))

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the active prepared dataloader is yielding its last batch."""
        return bool(self.active_dataloader is not None and getattr(self.active_dataloader, "end_of_dataloader", False))

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch of the active dataloader (-1 when unknown)."""
        if self.active_dataloader is None:
            return -1
        return getattr(self.active_dataloader, "remainder", -1)

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared dataloader is being iterated."""
        return self.active_dataloader is not None

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def register_dataloader(self, dataloader: Any) -> None:
        """A prepared loader starts handing out batches: it answers ``end_of_dataloader`` and ``remainder``
        until ``unregister_dataloader``. Loaders iterated inside another one's loop (an evaluation loop
        during training) stack: the innermost answers, and the outer one again once it is unregistered."""
        self.active_dataloader = dataloader
        self.dataloader_references.append(dataloader)

    def unregister_dataloader(self, dataloader: Any) -> None:
        """The loader's iteration ended or was abandoned (call it in a ``finally``)."""
        if dataloader in self.dataloader_references:
            self.dataloader_references.remove(dataloader)
        self.active_dataloader = self.dataloader_references[-1] if self.dataloader_references else None

    # The reference's names, which loaders written for Accelerate call.
    _add_dataloader = register_dataloader
    _remove_dataloader = unregister_dataloader

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()

    # One per process, like PartialState: copies are the same object; unpickling gives the
    # receiving process's own, set from the sender's settings when it has none (its dataloaders
    # are not sent along).
    def __reduce__(self) -> tuple[Any, ...]:
        settings = {k: v for k, v in self._shared_state.items() if k in _GRADIENT_SETTINGS}
        return (_restore_gradient_state, (settings,))

    def __copy__(self) -> GradientState:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> GradientState:
        return self
