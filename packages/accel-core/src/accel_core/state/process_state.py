"""``PartialState``: the process state shared by everything in one process: who am I, how many are we, which device.

Created once per process (later instances share the first one's state, so any module can ask
``PartialState().process_index`` cheaply); it reads its place from the run's settled record
(``accel_core.settings``) and joins the job's process group, or takes the placement a backend's runtime gives
(``accel_core.placement``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial, wraps
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from .. import environment as env
from ..attempt_store import attempt_store, wait_for_peers
from ..enums import DistributedType
from ..network_check import check_addresses, spans_machines
from ..placement import Collectives, ProcessPlacement
from ..settings import RunSettings, settle
from ..stall_report import start_watch, watched
from .splitting import split_inputs


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
# The timeout accel made the default group with (the script's InitProcessGroupKwargs, --collective-timeout): the
# groups accel makes later take it too, where torch would give each its own default (30 minutes for gloo).
_DEFAULT_GROUP_TIMEOUT: dict[str, timedelta] = {}


def collective_timeout(given: timedelta | None = None, settings: RunSettings | None = None) -> timedelta:
    """How long a collective waits for every rank before it fails: the process group's ``timeout``.

    A timeout the script gave (``InitProcessGroupKwargs(timeout=...)``) wins, then
    ``ACCEL_COLLECTIVE_TIMEOUT`` (seconds; ``accel launch --collective-timeout``), then 30 minutes.
    ``InitProcessGroupKwargs``'s own default (30 minutes) counts as not given. settings: the run's settled record
    (the environment, read, when not given).
    """
    if given is not None and given != DEFAULT_COLLECTIVE_TIMEOUT:
        return given
    seconds = env.get_seconds(env.COLLECTIVE_TIMEOUT, None if settings is None else settings.environ)
    return timedelta(seconds=seconds) if seconds is not None else DEFAULT_COLLECTIVE_TIMEOUT


def group_timeout() -> timedelta:
    """The timeout for a process group accel makes after the default one (a checkpoint's coordination group, ...):
    the default group's when accel made it, else ``collective_timeout()``. torch's ``new_group`` would otherwise
    wait 30 minutes whatever ``--collective-timeout`` says."""
    return _DEFAULT_GROUP_TIMEOUT.get("timeout") or collective_timeout()


def default_backend(device: torch.device) -> str:
    """The collective backend for ``device``: nccl for CUDA, xccl for XPU, gloo otherwise."""
    return {"cuda": "nccl", "xpu": "xccl"}.get(device.type, "gloo")


class StateResetError(AttributeError, RuntimeError):
    """An Accelerator made before ``AcceleratorState._reset_state()`` (or ``PartialState._reset_state()``) was used.

    An ``AttributeError``, as the reference raises from such an Accelerator (its state object has lost its
    fields), and a ``RuntimeError``, as accel raised before.
    """


class PartialState:
    """The process's place in the job, without anything the Accelerator adds.

    Reads this process's place from the run's settled record (``settings``: the Accelerator's; made here from
    the environment when the state is made alone: torchrun's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, or
    srun's, mpirun's, a PyTorchJob's translated) and initialises the default process group once when there is
    more than one process. ``cpu=True`` (or ``ACCEL_USE_CPU=true``) forces the CPU and gloo.

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
        {"world_size", "rank", "local_rank", "local_world_size", "cpu", "debug", "device", "backend", "settings"}
        | {"num_processes", "process_index", "local_process_index", "use_distributed", "distributed_type"}
        | {"is_main_process", "is_local_main_process", "is_last_process"}
    )

    def __init__(
        self,
        cpu: bool = False,
        placement: ProcessPlacement | None = None,
        settings: RunSettings | None = None,
        **init_process_group_kwargs: Any,
    ) -> None:
        self.__dict__ = self._shared_state
        if "device" in self._shared_state:
            return
        # Settled once (the Accelerator's record, else from the environment, which is only read).
        self.settings = settings if settings is not None else settle(os.environ)
        # Not an argument of init_process_group: when this process reports a collective that waits too long.
        stall_after = init_process_group_kwargs.pop("stall_report_after", None)
        if placement is not None:
            self._take_placement(placement, cpu)
            self._watch_stalls(stall_after, init_process_group_kwargs.get("timeout"))
            return
        self.world_size = self.settings.world_size
        self.rank = self.settings.rank
        self.local_rank = self.settings.local_rank
        self.local_world_size = self.settings.local_world_size
        self.cpu = bool(cpu) or self.settings.flag(env.USE_CPU)
        self.debug = self.settings.flag(env.DEBUG_MODE)
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
        timeout_seconds = collective_timeout(timeout, self.settings).total_seconds()
        start_watch(self.rank, self.world_size, stall_after, timeout_seconds, self.settings.environ)

    def _take_placement(self, placement: ProcessPlacement, cpu: bool) -> None:
        # The backend's runtime joined the processes already (its strategy's init_process_group).
        self.world_size = placement.world_size
        self.rank = placement.rank
        self.local_rank = placement.local_rank
        self.local_world_size = placement.local_world_size
        self.cpu = bool(cpu)
        self.debug = self.settings.flag(env.DEBUG_MODE)
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
        settings: RunSettings = self.settings
        if self.debug and not settings.environ.get(env.TORCH_DISTRIBUTED_DEBUG):
            # Debug mode under plain torchrun: torch's collective checks at DETAIL, set through its API before the
            # group (and its checking wrapper) is made; a TORCH_DISTRIBUTED_DEBUG the user set wins.
            dist.set_debug_level(dist.DebugLevel.DETAIL)
        backend = kwargs.pop("backend", None) or default_backend(self.device)
        kwargs["timeout"] = collective_timeout(kwargs.get("timeout"), settings)
        _DEFAULT_GROUP_TIMEOUT["timeout"] = kwargs["timeout"]
        if backend == "nccl" and self.device.type == "cuda":
            # device_id binds the default group to this GPU: NCCL connects it now (a network problem fails here,
            # not at the first collective) and later groups are split from it. The cost: every group made after
            # (the mesh's and its flattened views, a backend's own) connects as it is made, each with its GPU
            # buffers, used or not. Kept until bench/gpu_lane.py's process_groups_* cases have measured both ways on
            # a many-GPU node; a script that wants lazy groups calls dist.init_process_group("nccl") first (adopted).
            kwargs.setdefault("device_id", self.device)
        if kwargs.get("init_method") is None and kwargs.get("store") is None:
            connect = partial(attempt_store, self.world_size, kwargs["timeout"], settings.environ)
            if spans_machines(self.world_size, self.local_world_size, settings.environ):  # no loopback across machines
                store = check_addresses(
                    str(backend), self.rank, self.world_size, connect, kwargs["timeout"], settings.environ
                )
            else:
                store = connect()
            if store is not None:  # the agent's store outlives the attempt: keys of this attempt only
                # A roll call first: a peer whose function returned without joining fails this rank now, not
                # after the group timeout (the agent sees a returned peer as a success and would wait).
                wait_for_peers(store, self.rank, self.world_size, kwargs["timeout"])
                kwargs.update(store=store, rank=self.rank, world_size=self.world_size)
            elif settings.rendezvous_url is not None:  # srun / mpirun / a PyTorchJob: rank 0's address, not env://
                kwargs["init_method"] = settings.rendezvous_url
        if settings.launcher not in (None, "torchrun"):  # its ranks are in the settled record, not in os.environ
            kwargs.setdefault("rank", self.rank)
            kwargs.setdefault("world_size", self.world_size)
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
        yield split_inputs(inputs, self.num_processes, self.process_index, apply_padding)

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
            f"Distributed environment: {self.distributed_type}{f'  Backend: {self.backend}' if self.backend else ''}\n"
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
        "settings",
    }
)


def _restore_state(cls: type[PartialState], values: dict[str, Any]) -> PartialState:
    if not cls._shared_state:
        cls._shared_state.update(values)
    state = cls.__new__(cls)
    state.__dict__ = cls._shared_state
    return state
