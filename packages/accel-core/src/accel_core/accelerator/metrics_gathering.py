"""The Accelerator's evaluation across processes: ``gather_for_metrics`` and ``join_uneven_inputs``.

``gather_for_metrics`` gathers over the mesh's data-parallel group only (tensor- and
context-parallel peers read the same batches) and drops the samples the prepared dataloader
repeated to even out the last batch; tensors are checked for agreement across ranks in the same
collective that moves the small ones (``accel_core.collective_check``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from .. import ops
from ..collective_check import check_agreement, contains_tensor
from ..stall_report import watched

if TYPE_CHECKING:
    from ..configuration import DataLoaderConfiguration
    from ..parallel.dims import ParallelDims
    from ..state import GradientState
    from ..strategies import PreparedObjects, Strategy
    from .process_control import ProcessControl


class MetricsGathering:
    """Evaluation results from every data-parallel process (the Accelerator's ``gather_for_metrics`` and
    ``join_uneven_inputs``).

    process: the Accelerator's process view. gradient_state: where the prepared loaders report the end of
    their data and the last batch's real samples. dims: the mesh (gathers over ``dp``). strategy: named in
    warnings. prepared: the loaders whose ``even_batches`` a join block overrides. dataloader_config: the
    default ``even_batches``.
    """

    def __init__(
        self,
        process: ProcessControl,
        gradient_state: GradientState,
        dims: ParallelDims,
        strategy: Strategy,
        prepared: PreparedObjects,
        dataloader_config: DataLoaderConfiguration,
    ) -> None:
        self._process = process
        self._gradient_state = gradient_state
        self._dims = dims
        self._strategy = strategy
        self._prepared = prepared
        self._dataloader_config = dataloader_config

    @watched("gather_for_metrics")
    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``Accelerator.gather_for_metrics``: gathered over ``dp``, without the samples repeated at the end."""
        # Gather over the mesh's data parallelism: tensor- and context-parallel peers read the same
        # batches, so the world would repeat each sample (group None: every process).
        dp = self._dims.dp
        if dp.size == 1:  # every process read every sample: nothing to gather
            if use_gather_object:
                return list(input_data) if isinstance(input_data, (list, tuple)) else [input_data]
            return input_data
        remainder = self._gradient_state.remainder
        keep = remainder if self._gradient_state.end_of_dataloader and remainder > 0 else None
        group = dp.group
        if use_gather_object:
            data = ops.gather_object(input_data, group)
            return data[:keep] if keep is not None and isinstance(input_data, (list, tuple)) else data
        if (
            self._process._current_state.collectives is not None
        ):  # the backend's collectives (XLA): no torch.distributed group
            return _gather_samples(input_data, keep, group)
        # One agreement check for the whole structure, then the leaves move unchecked.
        if _only_tensors(input_data):
            # Small tensors travel with the check in one collective; larger ones after it.
            gathered = ops.checked_gather("gather_for_metrics", input_data, group)
            return gathered if keep is None else ops.recursively_apply(lambda t: t[:keep], gathered)
        check_agreement("gather_for_metrics", input_data, group, hint=ops.PAD_HINT)
        return _gather_samples(input_data, keep, group)

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """``Accelerator.join_uneven_inputs``: ``torch.distributed.algorithms.Join`` over ``joinables``."""
        from torch.distributed.algorithms.join import Join, Joinable

        if not self._process._current_state.use_distributed:
            yield
            return
        not_joinable = [
            f"{type(j).__name__} (position {i})" for i, j in enumerate(joinables) if not isinstance(j, Joinable)
        ]
        if not_joinable:
            # Name what was passed: the usual mistake is the unprepared model, not the strategy.
            why = (
                "pass the model accelerator.prepare returned"
                if self._strategy.name == "ddp"
                else f"the {self._strategy.name} strategy's prepared models are not Joinable; only DDP's are"
            )
            # The reference's words first ("only supported for multi-GPU"; scripts test for them), then accel's
            # reason: gloo's DDP joins too, and the check is on what was passed, not on the distributed type.
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU (or multi-CPU) training under "
                "DistributedDataParallel, as a result `join_uneven_inputs` will have no effect: "
                f"{', '.join(not_joinable)} passed to it {'is' if len(not_joinable) == 1 else 'are'} not torch "
                f"Joinable (a DDP-wrapped model or a ZeroRedundancyOptimizer is): {why}.",
                stacklevel=3,
            )
            yield
            return
        even = self._dataloader_config.even_batches if even_batches is None else even_batches
        saved = [
            (dl, dl.even_batches)
            for dl in self._prepared.dataloaders
            if hasattr(dl, "even_batches") and not _is_iterable(dl)
        ]
        if even_batches is not None and any(_is_iterable(dl) for dl in self._prepared.dataloaders):
            warnings.warn(
                "Overriding even_batches is only supported for map-style datasets, yet some dataloaders given were "
                "iterable",
                stacklevel=3,
            )
        try:
            if even_batches is not None:
                for dl, _ in saved:
                    dl.even_batches = even_batches
            with Join(joinables, enable=not even, throw_on_early_termination=False):
                yield
        finally:
            for dl, value in saved:
                dl.even_batches = value


def _is_iterable(dataloader: Any) -> bool:
    """Whether a prepared loader reads an iterable-style dataset (its even_batches cannot be overridden)."""
    return isinstance(getattr(dataloader, "dataset", None), torch.utils.data.IterableDataset)


def _only_tensors(data: Any) -> bool:
    if isinstance(data, Mapping):
        return all(_only_tensors(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return bool(data) and all(_only_tensors(v) for v in data)
    return isinstance(data, torch.Tensor)


def _gather_samples(data: Any, keep: int | None, group: Any = None) -> Any:
    """Gathers ``data`` along its sample dimension over ``group``; keeps the first ``keep`` samples when given."""
    if isinstance(data, torch.Tensor):
        gathered = ops.gather_unchecked(data, group)
        return gathered if keep is None else gathered[:keep]
    if isinstance(data, Mapping):
        return ops.mapping_like(data, {k: _gather_samples(v, keep, group) for k, v in data.items()})
    if isinstance(data, (list, tuple)) and contains_tensor(data):
        return ops.honor_type(data, (_gather_samples(v, keep, group) for v in data))
    gathered = ops.gather_object(data, group)  # a list of samples is concatenated; a lone object listed per process
    return gathered if keep is None or not isinstance(data, (list, tuple)) else gathered[:keep]
