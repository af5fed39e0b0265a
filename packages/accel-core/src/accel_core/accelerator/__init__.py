"""The Accelerator (a facade) and the parts it delegates to: preparation, resumption, tracking,
checkpointing, metrics gathering, the parallel layout, triggers, profiling; process control and the
setup queries are its two read-only base classes."""

import torch

from ..torch_floor import require_supported_torch

# Before the Accelerator's modules are imported: they use what torch added in 2.5 to 2.9 (public DTensor names,
# fully_shard's ignored_params, the pipeline schedules' scale_grads and return_outputs), and an older torch would
# otherwise fail there with an error that does not say what to do.
require_supported_torch(torch.__version__)

from .accelerator import Accelerator  # noqa: E402

__all__ = ["Accelerator"]
