"""``prepare_data_loader`` and ``skip_first_batches``: the standalone entry points of accel-data."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from .comm import Comm, resolve_comm
from .loader import DataLoaderShard, ShardedLoaderMixin
from .rng import normalize_rng_types
from .samplers import (
    BatchSamplerShard,
    SeedableRandomSampler,
    UnbatchedShard,
    _SingletonBatches,
    ensure_generator,
    seedable_copy,
)
from .sharding import ShardPlan
from .worker_guard import guarded

if TYPE_CHECKING:
    from accel_core.protocols import BatchBoundaryHook


@lru_cache(maxsize=1)
def _stateful_base() -> type | None:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader  # pyright: ignore[reportMissingImports]  # optional
    except ImportError:
        return None
    return StatefulDataLoader


@lru_cache(maxsize=1)
def stateful_loader_class() -> type:
    """``StatefulDataLoaderShard``: the prepared loader built on torchdata's ``StatefulDataLoader``."""
    base = _stateful_base()
    if base is None:
        raise ImportError(
            'use_stateful_dataloader=True needs torchdata\'s StatefulDataLoader: pip install "accel-data[stateful]".'
        )
    return type("StatefulDataLoaderShard", (ShardedLoaderMixin, base), {"__module__": __name__})


def _loader_kwargs(loader: DataLoader) -> dict[str, Any]:
    """What to pass on to rebuild ``loader``: everything but the dataset and how it is sampled."""
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        # Workers end when the training process dies while they start (torch's own check misses that).
        "worker_init_fn": guarded(loader.worker_init_fn) if loader.num_workers > 0 else loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
    }
    for name in ("in_order", "snapshot_every_n_steps"):  # newer torch; torchdata's StatefulDataLoader
        if hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    return kwargs


def _resolve_processes(num_processes: int | None, process_index: int | None, group: Any | None) -> tuple[int, int]:
    import torch.distributed as dist

    if group is not None:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if num_processes is not None and num_processes != size:
            raise ValueError(f"num_processes={num_processes} does not match the size of `group` ({size}).")
        return size, rank
    if num_processes is None or process_index is None:
        if dist.is_available() and dist.is_initialized():
            size, rank = dist.get_world_size(), dist.get_rank()
        else:
            from accel_core.state import PartialState

            state = PartialState()
            size, rank = state.num_processes, state.process_index
        num_processes = size if num_processes is None else num_processes
        process_index = rank if process_index is None else process_index
    if not 0 <= process_index < num_processes:
        raise ValueError(f"process_index must be in [0, {num_processes}), got {process_index}.")
    return num_processes, process_index


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | str | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: Sequence[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    group: Any | None = None,
    rng_over_world: bool = False,
    boundary_hook: BatchBoundaryHook | None = None,
) -> DataLoader:
    """Returns a loader yielding this process's share of every step of ``dataloader``.

    num_processes / process_index: default to the process group's (or a single process). Without
        a process group they may be set by hand: each process of your own launcher (or a test)
        then gets its share with nothing synchronised.
    split_batches: ``dataloader``'s batch is the global one, cut between processes; otherwise every
        process gets batches of the loader's size.
    dispatch_batches: ``True`` makes process 0 read all batches and send each process its share
        (for data only process 0 can read). ``None``/``False``: every process samples (map-style)
        or reads the stream and keeps its batches (iterable datasets) — no traffic.
    even_batches: complete the last step with samples from the start so every process gets the same
        number of batches (``remainder`` tells how many of the last step are real).
    rng_types: generators to synchronise from process 0 at each epoch (``"generator"``,
        ``"torch"``, ``"cuda"``, ``"xpu"``); ``None`` means ``["generator"]`` with several processes.
    use_seedable_sampler / data_seed: shuffle with ``seed + epoch`` (same on every process and resume).
    group: the torch.distributed group to shard over (a data-parallel group); default the world.
    rng_over_world: synchronise the RNGs (``rng_types``) from process 0 of the whole world rather than
        of ``group``: every data-parallel group then draws the same permutation, so processes with the
        same rank in different groups (tensor- or context-parallel peers) get the same batches. Every
        process of the world must prepare the loader (the Accelerator does).
    boundary_hook: called with the loader at each request for a batch and at the end of each epoch
        (``accel_core.protocols.BatchBoundaryHook``); kept as ``loader.batch_boundary_hook``. The
        Accelerator passes its own, which takes the periodic checkpoints there.

    Example::

        import torch.distributed as dist
        from torch.utils.data import DataLoader
        from accel_data import prepare_data_loader

        dist.init_process_group("gloo")  # under torchrun
        loader = prepare_data_loader(DataLoader(range(100), batch_size=8, shuffle=True))
        for batch in loader:
            ...  # each process gets different samples; together exactly one epoch
    """
    if isinstance(dataloader, ShardedLoaderMixin):
        # Already prepared: preparing twice would shard twice. It keeps the hook it has (no silent take-over).
        if dataloader.batch_boundary_hook is None:
            dataloader.batch_boundary_hook = boundary_hook
        return dataloader
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader expects a torch.utils.data.DataLoader, got {type(dataloader).__name__}.")
    n, rank = _resolve_processes(num_processes, process_index, group)
    dispatch = bool(dispatch_batches)
    comm = resolve_comm(group, n)
    if dispatch and n > 1 and comm is None:
        raise ValueError(
            "dispatch_batches=True needs an initialized torch.distributed process group of num_processes "
            "processes (launch with torchrun / accel launch), or set dispatch_batches=False."
        )
    dispatch = dispatch and n > 1
    rng_comm = comm
    if rng_over_world and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rng_comm = Comm(None)
    names = normalize_rng_types(rng_types, max(n, rng_comm.size if rng_comm is not None else 1))
    if put_on_device and device is None:
        from accel_core.state import PartialState

        device = PartialState().device
    device = torch.device(device) if device is not None else None

    stateful_base = _stateful_base()
    is_stateful = stateful_base is not None and isinstance(dataloader, stateful_base)
    cls: type = stateful_loader_class() if (use_stateful_dataloader or is_stateful) else DataLoaderShard
    kwargs = _loader_kwargs(dataloader)
    if cls is DataLoaderShard:
        kwargs.pop("snapshot_every_n_steps", None)
    dataset = dataloader.dataset
    seedable: SeedableRandomSampler | None = None
    shard: BatchSamplerShard | None = None
    plan: ShardPlan | None = None
    sampler: Any = None
    private_rng = False

    if isinstance(dataset, IterableDataset):
        kind = "iterable"
        plan = ShardPlan(n, split_batches, even_batches, dataloader.drop_last, dataloader.batch_size)
        loader = cls(dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last, **kwargs)
        generator = getattr(dataset, "generator", None)
        generator = generator if isinstance(generator, torch.Generator) else None
    else:
        kind = "map"
        batch_sampler = dataloader.batch_sampler
        # `DataLoader(sampler=BatchSampler(...), batch_size=None)`: the sampler yields lists of indices
        # and the dataset reads one batch per list. Shard those lists as a batch sampler's, and
        # synchronise / seed the sampler inside it.
        index_batches = batch_sampler is None and isinstance(dataloader.sampler, BatchSampler)
        if index_batches:
            if split_batches and n > 1:
                raise ValueError(
                    "split_batches=True cannot split a DataLoader whose sampler yields batches (batch_size=None): "
                    "pass the BatchSampler as batch_sampler=... instead, or use split_batches=False."
                )
            batch_sampler = dataloader.sampler
        sampler = getattr(batch_sampler, "sampler", None) if batch_sampler is not None else dataloader.sampler
        if use_seedable_sampler and type(sampler) is RandomSampler:
            seed = int(data_seed) if data_seed is not None else torch.initial_seed()
            seedable = seedable_copy(sampler, seed)
            if batch_sampler is not None and type(batch_sampler) is BatchSampler:
                batch_sampler = BatchSampler(seedable, batch_sampler.batch_size, batch_sampler.drop_last)
                sampler = seedable
            elif batch_sampler is None:
                sampler = seedable
            else:
                seedable = None  # a custom batch sampler keeps its own sampler
        # Several processes sharding one sampler need its order alike: it gets a generator, synchronised
        # from process 0 at each epoch (Accelerate's rule). Read by one process (a single process, the
        # dispatching process 0, tensor-parallel peers each reading all of it), a sampler without a
        # generator draws its order from the global RNG at each pass, as in PyTorch.
        shared = n > 1 and not dispatch
        had_no_generator = getattr(sampler, "generator", None) is None
        generator = None if seedable is not None else ensure_generator(sampler, create=shared)
        # A generator made here, or a seedable sampler's seed, is drawn from by the sampler alone: once
        # synchronised, the processes stay alike (a generator the user passed may be drawn from elsewhere).
        private_rng = shared and (seedable is not None or (had_no_generator and generator is not None))
        shard_rank = None if (dispatch and comm is not None and comm.is_source) else rank
        if batch_sampler is None:
            if split_batches and n > 1:
                raise ValueError(
                    "split_batches=True needs a batch size: give the DataLoader batch_size=..., or use "
                    "split_batches=False."
                )
            # Without a batch sampler, `sampler` is the loader's sampler (or its seedable copy).
            indices = cast("Iterable[Any]", sampler)
            shard = BatchSamplerShard(_SingletonBatches(indices), n, shard_rank, False, even_batches)
            loader = cls(dataset, batch_size=None, sampler=UnbatchedShard(shard), **kwargs)
        else:
            shard = BatchSamplerShard(batch_sampler, n, shard_rank, split_batches, even_batches)
            if index_batches:
                loader = cls(dataset, batch_size=None, sampler=shard, **kwargs)
            else:
                loader = cls(dataset, batch_sampler=shard, **kwargs)
            if sampler is not None and not index_batches:
                # Introspection (``loader.sampler.set_epoch``, length checks) sees the user's sampler.
                object.__setattr__(loader, "sampler", sampler)

    # Tensor/context-parallel peers (one process per data-parallel group) each read the whole sampler:
    # they draw alike from the global RNG once it is synchronised from the first process at each epoch.
    sync_draw = False
    if shard is not None and generator is None and seedable is None:
        shard.track_draw = True
        shard.draw_sampler = sampler
        sync_draw = not dispatch and n == 1 and rng_comm is not None and rng_comm.size > 1
    loader._accel_setup(
        base=dataloader,
        kind=kind,
        shard=shard,
        plan=plan,
        num_processes=n,
        process_index=rank,
        split_batches=split_batches,
        dispatch=dispatch,
        device=device,
        put_on_device=put_on_device,
        non_blocking=non_blocking,
        rng_types=names,
        comm=comm,
        rng_comm=rng_comm,
        generator=generator,
        seedable=seedable,
        stateful=cls is not DataLoaderShard,
        boundary_hook=boundary_hook,
        sync_draw=sync_draw,
        private_rng=private_rng,
    )
    return loader


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
    """A loader whose iterations start ``num_batches`` steps in, without reading the skipped samples
    (map-style datasets; an iterable stream is read and dropped).

    The returned loader shares its epoch counter with ``dataloader``: iterate it for the resumed
    epoch, then ``dataloader`` again for the next ones.

    Example::

        for batch in skip_first_batches(loader, 10):  # resumes at the 11th step of the epoch
            ...
    """
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    if not isinstance(dataloader, ShardedLoaderMixin):
        dataloader = prepare_data_loader(dataloader, num_processes=1, process_index=0, rng_types=[])
    # Every prepared loader is a DataLoader subclass with the ShardedLoaderMixin.
    return cast(DataLoader, cast(ShardedLoaderMixin, dataloader)._with_skip(num_batches))
