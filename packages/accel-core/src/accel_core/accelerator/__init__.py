"""The Accelerator (a facade) and the parts it delegates to: preparation, resumption, tracking,
checkpointing, metrics gathering, the parallel layout, triggers, profiling; process control and the
setup queries are its two read-only base classes."""

import torch

from ..torch_floor import require_supported_torch

# Before the Accelerator's modules are imported: they use names torch made public in 2.5 and 2.6, and an older
# torch would otherwise fail there with an ImportError that does not say what to do.
require_supported_torch(torch.__version__)

from .accelerator import Accelerator  # noqa: E402

__all__ = ["Accelerator"]
