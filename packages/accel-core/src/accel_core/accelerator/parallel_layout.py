"""The Accelerator's view of the job's layout: the mesh, the parallelism config, ranks along each dimension,
and the context-parallel block."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from ..parallel.config import ParallelismConfig
    from ..parallel.dims import ParallelDims
    from ..precision.modes import Precision
    from ..state import GradientState
    from ..strategies import Strategy

logger = logging.getLogger("accel")


class Parallelism:
    """Mixin of the Accelerator: one named device mesh per job (see ``accel_core.parallel.dims``), and the training step
    that works under pipeline parallelism too (``forward_backward``)."""

    parallel_dims: ParallelDims
    strategy: Strategy
    precision: Precision
    gradient_state: GradientState
    backward: Callable[..., None]

    @property
    def parallelism_config(self) -> ParallelismConfig:
        """The resolved layout: every size set (``dp_replicate_size`` ... ``pp_size``)."""
        return self.parallel_dims.config

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The job's ``DeviceMesh`` (dimensions ``dp_replicate``, ``dp_shard``, and ``cp`` / ``tp`` when used;
        flattened views ``dp``, ``dp_shard_cp``, ``dp_cp``); None for one process without a process group."""
        return self.parallel_dims.mesh

    @property
    def torch_device_mesh(self) -> DeviceMesh | None:
        """The reference API's name for ``device_mesh``."""
        return self.parallel_dims.mesh

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's place in its tensor-parallel group (0 without tensor parallelism)."""
        return self.parallel_dims.local_rank("tp")

    @property
    def context_parallel_rank(self) -> int:
        """This process's index along the mesh's ``cp`` dimension (0 without context parallelism)."""
        return self.parallel_dims.local_rank("cp")

    @property
    def data_parallel_rank(self) -> int:
        """This process's replica index along ``dp_replicate`` (the reference's meaning; 0 when not replicated)."""
        return self.parallel_dims.local_rank("dp_replicate")

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's index along ``dp_shard`` (0 when parameters are not sharded)."""
        return self.parallel_dims.local_rank("dp_shard")

    @property
    def pipeline_parallel_rank(self) -> int:
        """This process's index along the mesh's ``pp`` dimension (0 without pipeline parallelism); with
        ``pp_stages_per_rank > 1`` it holds stages ``rank, rank + pp_size, ...``."""
        return self.parallel_dims.local_rank("pp")

    def forward_backward(
        self,
        model: torch.nn.Module,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
    ) -> torch.Tensor:
        """One training micro-step: forward, ``loss_fn(outputs, targets)``, backward; returns the loss (detached).

        inputs: the model's arguments: a tensor (one argument), a tuple (positional arguments) or a
            dict (keyword arguments).
        loss_fn: ``loss_fn(outputs, targets) -> scalar loss``, a mean over the samples of its batch.

        Without pipeline parallelism it is exactly ``loss = loss_fn(model(inputs), targets);
        accelerator.backward(loss)`` (accumulation and precision as there). With ``pp_size > 1`` it
        runs the pipeline schedule over ``pp_microbatches`` micro-batches (the batch size must
        divide) and returns the batch's mean loss on every rank (sent from the last stage). Use it
        inside ``accumulate`` like ``backward``; ``optimizer.step()``, ``clip_grad_norm_`` and the
        scheduler stay as they are.

        Example::

            for inputs, targets in loader:
                with accelerator.accumulate(model):
                    loss = accelerator.forward_backward(model, inputs, targets, torch.nn.functional.cross_entropy)
                    optimizer.step(); scheduler.step(); optimizer.zero_grad()
        """
        from ..pipelining import StagedModel, as_call_arguments

        if isinstance(model, StagedModel):
            owns_step = self.strategy.owns_optimizer_step
            divisor = 1 if owns_step else int(self.gradient_state.num_steps)
            return model.train_step(inputs, targets, loss_fn, divisor=divisor, scale=self.precision.scale_loss)
        args, kwargs = as_call_arguments(inputs)
        loss = loss_fn(model(*args, **kwargs), targets)
        self.backward(loss)
        return loss.detach()

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """Inside the block, each process of a ``cp`` group holds ``1/cp_size`` of each buffer along its
        sequence dim, and attention (``F.scaled_dot_product_attention``) runs as ring attention over the group.

        Enter it anew at each step. Without context parallelism it does nothing. Needs a GPU for the
        attention itself (see ``accel_core.transforms.context_parallel``).

        Example::

            for batch in loader:
                with accelerator.maybe_context_parallel(buffers=[batch["input_ids"], batch["labels"]],
                                                        buffer_seq_dims=[1, 1]):
                    loss = model(batch["input_ids"], labels=batch["labels"]).loss
                    accelerator.backward(loss)
        """
        config = self.parallel_dims.config
        if not config.cp_enabled:
            if not getattr(self, "_warned_no_cp", False):
                self._warned_no_cp = True
                logger.warning(
                    "maybe_context_parallel: context parallelism is off (cp_size=1); the block runs as it is."
                )
            yield
            return
        from ..transforms.context_parallel import context_parallel_block

        with context_parallel_block(
            self.parallel_dims.submesh("cp"), buffers, buffer_seq_dims, no_restore_buffers, config.cp_comm_strategy
        ):
            yield
