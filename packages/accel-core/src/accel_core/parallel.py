"""The Accelerator's view of the job's layout: the mesh, the parallelism config, ranks along each dimension,
and the context-parallel block."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from .mesh import ParallelDims
    from .parallelism import ParallelismConfig

logger = logging.getLogger("accel")


class Parallelism:
    """Mixin of the Accelerator: one named device mesh per job (see ``accel_core.mesh``)."""

    parallel_dims: ParallelDims

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
        """This process's pipeline stage; pipeline parallelism is not available yet, so it raises."""
        raise NotImplementedError("Pipeline parallelism is not available in accel yet.")

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
        from .transforms.context_parallel import context_parallel_block

        with context_parallel_block(
            self.parallel_dims.submesh("cp"), buffers, buffer_seq_dims, no_restore_buffers, config.cp_comm_strategy
        ):
            yield
