"""The steps that depend on the job's layout: the context-parallel block, and ``forward_backward`` (which runs a
pipeline schedule for a staged model). The mesh, the parallelism config and the ranks along each dimension are
read from ``ParallelDims`` directly (the Accelerator's properties)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ..parallel.dims import ParallelDims
    from ..precision.modes import Precision
    from ..state import GradientState
    from ..strategies import PreparedObjects, Strategy

logger = logging.getLogger("accel")


class ParallelLayout:
    """The training step that works under pipeline parallelism too (``forward_backward``) and the context-parallel
    block, over the job's one named device mesh (see ``accel_core.parallel.dims``).

    dims: the job's mesh and layout. strategy, precision, gradient_state: how a pipeline schedule divides and
    scales its loss as ``backward`` does. backward: the Accelerator's ``backward``, for a model without stages.
    prepared: the prepared models' records (which of them runs a pipeline).
    """

    def __init__(
        self,
        dims: ParallelDims,
        strategy: Strategy,
        precision: Precision,
        gradient_state: GradientState,
        backward: Callable[[torch.Tensor], None],
        prepared: PreparedObjects,
    ) -> None:
        self._dims = dims
        self._prepared = prepared
        self._strategy = strategy
        self._precision = precision
        self._gradient_state = gradient_state
        self._backward = backward
        self._warned_no_cp = False

    def forward_backward(
        self,
        model: torch.nn.Module,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
    ) -> torch.Tensor:
        """``Accelerator.forward_backward``: forward, loss, backward; a staged model runs its pipeline schedule."""
        from ..pipelining import as_call_arguments

        record = self._prepared.record_of(model)
        if record is not None and record.pipeline is not None:
            owns_step = self._strategy.owns_optimizer_step
            divisor = 1 if owns_step else int(self._gradient_state.num_steps)
            scale = self._precision.scale_loss
            return record.pipeline.train_step(inputs, targets, loss_fn, divisor=divisor, scale=scale)
        args, kwargs = as_call_arguments(inputs)
        loss = loss_fn(model(*args, **kwargs), targets)
        self._backward(loss)
        return loss.detach()

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """``Accelerator.maybe_context_parallel``: the buffers sharded over ``cp`` and ring attention inside the
        block; a warning, once, without context parallelism."""
        config = self._dims.config
        if not config.cp_enabled:
            if not self._warned_no_cp:
                self._warned_no_cp = True
                logger.warning(
                    "maybe_context_parallel: context parallelism is off (cp_size=1); the block runs as it is."
                )
            yield
            return
        from ..transforms.context_parallel import context_parallel_block

        with context_parallel_block(
            self._dims.submesh("cp"), buffers, buffer_seq_dims, no_restore_buffers, config.cp_comm_strategy
        ):
            yield
