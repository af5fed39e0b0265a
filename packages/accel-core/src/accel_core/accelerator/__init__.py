"""The Accelerator and the parts it is assembled from (preparation, resumption, checkpointing and
tracking, metrics gathering, the parallel layout, process control, triggers, profiling)."""

from .accelerator import Accelerator

__all__ = ["Accelerator"]
