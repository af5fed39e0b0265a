"""The ``accel.preparers: dataloader`` entry point: maps an ``Accelerator`` onto ``prepare_data_loader``.

What it reads of the Accelerator is declared by ``accel_core.protocols.DataAccelerator``: the
mesh's data parallelism (``parallel_dims.dp``: size, rank, group), ``dataloader_config``,
``device`` and ``rng_types``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .prepare import prepare_data_loader, skip_first_batches

if TYPE_CHECKING:
    from accel_core.protocols import BatchBoundaryHook, DataAccelerator


class DataLoaderPreparer:
    """Implements ``accel_core.protocols.DataLoaderPreparer`` with accel-data's loaders."""

    def prepare(
        self,
        dataloader: Any,
        accelerator: DataAccelerator,
        device_placement: bool,
        boundary_hook: BatchBoundaryHook | None = None,
    ) -> Any:
        config = accelerator.dataloader_config
        dp = accelerator.parallel_dims.dp
        return prepare_data_loader(
            dataloader,
            device=accelerator.device,
            num_processes=dp.size,
            process_index=dp.rank,
            split_batches=config.split_batches,
            put_on_device=device_placement,
            rng_types=None if accelerator.rng_types is None else list(accelerator.rng_types),
            dispatch_batches=config.dispatch_batches,
            even_batches=config.even_batches,
            use_seedable_sampler=config.use_seedable_sampler,
            data_seed=config.data_seed,
            non_blocking=config.non_blocking,
            use_stateful_dataloader=config.use_stateful_dataloader,
            group=dp.group,
            rng_over_world=True,  # tensor/context-parallel peers sit in different dp groups: one permutation for all
            boundary_hook=boundary_hook,
        )

    def skip_first_batches(self, dataloader: Any, num_batches: int) -> Any:
        return skip_first_batches(dataloader, num_batches)


PREPARER = DataLoaderPreparer()
