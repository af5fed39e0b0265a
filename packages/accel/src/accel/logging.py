"""``accel.logging``: ``get_logger`` for scripts (the reference's ``accelerate.logging``). No torch import.

Example::

    from accel.logging import get_logger
    logger = get_logger(__name__, log_level="INFO")
"""

from __future__ import annotations

from accel_core.logging import MultiProcessAdapter, get_logger

__all__ = ["MultiProcessAdapter", "get_logger"]
