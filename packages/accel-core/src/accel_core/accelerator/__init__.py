"""The Accelerator (a facade) and the parts it delegates to: preparation, resumption, tracking,
checkpointing, metrics gathering, the parallel layout, triggers, profiling; process control and the
setup queries are its two read-only base classes."""

from .accelerator import Accelerator

__all__ = ["Accelerator"]
