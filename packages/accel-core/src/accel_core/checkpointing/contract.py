"""What a strategy that saves its own (sharded) state implements, and what accel-checkpoint hands it to do so.

accel-checkpoint owns the checkpoint folder and is its one writer: it writes everything, crash-safe, fsyncs and
hashes each file once. A strategy whose models or optimizers are split across processes hands its state over
(``HandsOverShardedState``: FSDP, and the DCP default for DTensor models): what each process holds, as
``torch.distributed.checkpoint`` state dicts and plain files (``ShardedState``), and accel-checkpoint writes
it, on a background thread for ``save_state(async_save=True)`` once it is copied to CPU memory.

Backends whose own library must write its files (DeepSpeed's engine, Megatron, torch-xla's ``xm.save``)
keep a declared escape hatch, ``ShardedCheckpointing``: they fill a folder accel-checkpoint gives them while the
snapshot is taken, and accel-checkpoint fsyncs and hashes what they wrote. Whatever a strategy needs of
accel-checkpoint (safe loading, agreement between processes, durable writes) comes in the ``CheckpointIO``
passed with each call: the caller hands the service over, so a backend depends on accel-core alone and never
imports accel-checkpoint. No torch at run time here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..strategies.context import PreparedObjects

# What ``save_sharded`` may say it covered; accel-checkpoint writes the other categories itself.
MODELS = "models"
OPTIMIZERS = "optimizers"
SCHEDULERS = "schedulers"


class Coordination(Protocol):
    """Agreement between the job's processes during a save or load; with one process each call is a local no-op.

    It runs on a gloo group of its own (``accel_core.strategies.groups.coordination_group``), apart from the
    training collectives, so small Python objects travel whatever device the default group uses. Use it from
    one thread at a time. Prefer ``agree`` to a barrier: when one process fails (disk full, missing file), a
    barrier would leave the others waiting forever, while ``agree`` makes every process raise.
    """

    @property
    def rank(self) -> int:
        """This process's rank in the whole job."""
        ...

    @property
    def world_size(self) -> int:
        """The number of processes of the job."""
        ...

    def gather(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (picklable), in rank order, on every process."""
        ...

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of process ``src``, on every process."""
        ...

    def barrier(self) -> None:
        """Returns once every process has called it."""
        ...

    def agree(self, error: BaseException | None, what: str) -> None:
        """Raises on every process if ``what`` failed on any: the local ``error`` where it happened, a
        ``CheckpointError`` naming the failed process (and its error) on the others."""
        ...


class CheckpointIO(Protocol):
    """The services accel-checkpoint hands to ``save_sharded`` / ``load_sharded`` (keyword ``io``).

    A strategy reads and writes its files through these instead of importing accel-checkpoint, so its files
    get the same guarantees as the rest of the checkpoint: nothing is unpickled that could run code unless the
    user opted in, every process fails together, and folders built in several steps never look finished early.
    """

    @property
    def allow_unsafe_pickle(self) -> bool:
        """Whether the user opted in to full unpickling for this load (``load_state(..., allow_unsafe_pickle=True)``
        or ``ACCEL_ALLOW_UNSAFE_PICKLE=1``); False when saving. A strategy whose files are read by another
        library's loader checks what they would import unless this is True."""
        ...

    @property
    def coordinator(self) -> Coordination:
        """The agreement between processes of the save or load in progress."""
        ...

    def load_torch_file(self, path: str) -> Any:
        """A file written by ``torch.save``, loaded onto the CPU with ``weights_only=True`` (tensors, numpy arrays,
        plain values) unless the user opted in. Raises ``CheckpointNotFoundError``, ``CorruptCheckpointError`` or
        ``UnsafeCheckpointError`` (``accel_core.checkpointing.errors``), each naming the file and what to do."""
        ...

    def load_dcp(self, state_dict: dict[str, Any], path: str) -> None:
        """``torch.distributed.checkpoint.load(state_dict, path)`` in place (collective; DCP reshards to the current
        layout), with DCP's metadata and non-tensor values read without unpickling arbitrary objects."""
        ...

    def write_json(self, path: str, obj: Any) -> None:
        """Writes ``obj`` as JSON, flushed and fsynced before returning."""
        ...

    def partial_path(self, final: str) -> str:
        """A fresh hidden sibling of the folder ``final``, to build it in and then rename into place, so that an
        interrupted build never leaves a folder that a later run takes for a finished one."""
        ...


@dataclass
class ShardedState:
    """What a strategy hands accel-checkpoint to write for this process (``HandsOverShardedState.sharded_state``).

    dcp: folder name (inside the checkpoint's ``sharded/`` folder) -> the state dict
        ``torch.distributed.checkpoint`` saves there; the same names on every process (the save is collective:
        each process writes its own shards, DCP's metadata says how they fit together).
    files: file name (inside ``sharded/``) -> an object saved with ``torch.save`` by this process only (FSDP's
        gathered optimizer state on the main process); plain CPU data.
    covers: the categories this covers (a subset of ``{MODELS, OPTIMIZERS, SCHEDULERS}``); accel-checkpoint
        writes the others.
    """

    dcp: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, Any] = field(default_factory=dict)
    covers: Collection[str] = ()


@runtime_checkable
class HandsOverShardedState(Protocol):
    """The strategy hands its (sharded) state over and accel-checkpoint writes it: the preferred way.

    ``sharded_state`` is called on every process (it may gather: collective) and returns what to write; the
    state is copied to CPU memory before the call to ``save_state(async_save=True)`` returns, and written after
    (on a background thread), so it must not be written by the strategy. ``load_sharded`` gets the folder
    back, as in ``ShardedCheckpointing``. Other keyword arguments are the user's ``save_state(**kwargs)``.
    """

    def sharded_state(self, prepared: PreparedObjects, **kwargs: Any) -> ShardedState: ...

    def load_sharded(
        self,
        prepared: PreparedObjects,
        folder: str,
        *,
        io: CheckpointIO,
        allow_unsafe_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None: ...


@runtime_checkable
class ShardedCheckpointing(Protocol):
    """The escape hatch for a backend whose own library must write its files (DeepSpeed, Megatron, torch-xla):
    the strategy saves its (sharded) models / optimizers itself; accel-checkpoint writes the rest around them,
    then fsyncs and hashes what the strategy wrote. Written while the snapshot is taken, so an asynchronous save
    returns only after them: prefer ``HandsOverShardedState`` where the state can be handed over.

    ``save_sharded`` is called on every process with an empty folder inside the checkpoint being written and
    returns what it covered: a subset of ``{MODELS, OPTIMIZERS, SCHEDULERS}``; other keyword arguments are the
    user's ``save_state(**kwargs)``. ``load_sharded`` gets the same folder back, and ``allow_unsafe_pickle`` as
    given to ``load_state`` (None when not given; ``io.allow_unsafe_pickle`` is the resolved answer). Both are
    collective and get ``io``: what accel-checkpoint hands over for reading and writing the folder.
    """

    def save_sharded(
        self, prepared: PreparedObjects, folder: str, *, io: CheckpointIO, **kwargs: Any
    ) -> Collection[str]: ...

    def load_sharded(
        self,
        prepared: PreparedObjects,
        folder: str,
        *,
        io: CheckpointIO,
        allow_unsafe_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None: ...


__all__ = [
    "MODELS",
    "OPTIMIZERS",
    "SCHEDULERS",
    "CheckpointIO",
    "Coordination",
    "HandsOverShardedState",
    "ShardedCheckpointing",
    "ShardedState",
]
