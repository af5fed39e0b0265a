"""The ``accel.preparers: dataloader`` entry point: maps an ``Accelerator`` onto ``prepare_data_loader``."""

from __future__ import annotations

from typing import Any

from .prepare import prepare_data_loader, skip_first_batches


def _data_parallel(accelerator: Any) -> tuple[int, int, Any | None]:
    """Size, rank and group of the data-parallel group the strategy shards data over."""
    strategy = getattr(accelerator, "strategy", None)
    size = getattr(strategy, "data_parallel_size", None)
    rank = getattr(strategy, "data_parallel_rank", None)
    group = getattr(strategy, "data_parallel_group", None)
    if size is None or rank is None:
        info = getattr(strategy, "data_parallel_info", None)
        if callable(info):
            found = info()
            if isinstance(found, tuple) and len(found) >= 2:
                size, rank = found[0], found[1]
                group = found[2] if len(found) > 2 else group
            else:
                size = getattr(found, "size", getattr(found, "data_parallel_size", size))
                rank = getattr(found, "rank", getattr(found, "data_parallel_rank", rank))
                group = getattr(found, "group", getattr(found, "data_parallel_group", group))
    if size is None or rank is None:
        size, rank, group = accelerator.num_processes, accelerator.process_index, None
    return int(size), int(rank), group


class DataLoaderPreparer:
    """Implements ``accel_core.protocols.DataLoaderPreparer`` with accel-data's loaders."""

    def prepare(self, dataloader: Any, accelerator: Any, device_placement: bool) -> Any:
        config = accelerator.dataloader_config
        size, rank, group = _data_parallel(accelerator)
        return prepare_data_loader(
            dataloader,
            device=accelerator.device,
            num_processes=size,
            process_index=rank,
            split_batches=config.split_batches,
            put_on_device=device_placement,
            rng_types=None if accelerator.rng_types is None else list(accelerator.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
            group=group,
        )

    def skip_first_batches(self, dataloader: Any, num_batches: int) -> Any:
        return skip_first_batches(dataloader, num_batches)


PREPARER = DataLoaderPreparer()
