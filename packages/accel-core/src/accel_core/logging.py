"""``get_logger``: a standard ``logging`` logger that prints once per job, not once per process.

Importing this module does not import torch: scripts call ``get_logger(__name__)`` at the top,
before any state exists. The process state is consulted when a record is emitted.

Example::

    from accel.logging import get_logger

    logger = get_logger(__name__, log_level="INFO")
    accelerator = Accelerator()
    logger.info("starting")                              # main process only
    logger.info("my shard is ready", main_process_only=False)
    logger.info(f"rank {accelerator.process_index}", in_order=True)   # rank 0, then 1, ...
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

# The variables that set the default level; accel's name first, then the reference's.
LOG_LEVEL_ENV = ("ACCEL_LOG_LEVEL", "ACCELERATE_LOG_LEVEL")


def _initialised_state() -> Any:
    """The process state, or a RuntimeError when neither ``PartialState()`` nor ``Accelerator()`` has run."""
    state_module = sys.modules.get("accel_core.state")
    if state_module is None or not state_module.PartialState.is_initialized():
        raise RuntimeError(
            "You must initialize the accel state by calling either `PartialState()` or `Accelerator()` before "
            "using the logging utility."
        )
    return state_module.PartialState()


class MultiProcessAdapter(logging.LoggerAdapter):
    """A ``LoggerAdapter`` that logs on the main process only, unless told otherwise.

    Every logging call accepts two extra keywords: ``main_process_only`` (default True) and
    ``in_order`` (default False: every process logs, one after the other, rank 0 first; it waits
    for all processes, so all of them must make the call). Messages are prefixed ``[RANK i]``.
    """

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        msg, kwargs = super().process(msg, kwargs)
        # Point findCaller at the user's line, not at this adapter (the user may still choose).
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {_initialised_state().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Logs ``msg`` at ``level`` where ``main_process_only`` / ``in_order`` say (see the class)."""
        state = _initialised_state()
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, processed = self.process(msg, kwargs)
        if in_order:
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    self.logger.log(level, msg, *args, **processed)
                state.wait_for_everyone()
        elif not main_process_only or state.is_main_process:
            self.logger.log(level, msg, *args, **processed)

    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning(...)``, but a second call with the same arguments prints nothing."""
        key = (args, tuple(sorted(kwargs.items())))
        seen: set[Any] = self.__dict__.setdefault("_warned", set())
        if key in seen:
            return
        seen.add(key)
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """The logger ``name`` wrapped so that it logs on the main process only (see ``MultiProcessAdapter``).

    log_level: "DEBUG", "INFO", ...; set on this logger and on the root logger. Default: the
        ``ACCEL_LOG_LEVEL`` (or ``ACCELERATE_LOG_LEVEL``) environment variable, else unchanged.
    """
    if log_level is None:
        log_level = next((os.environ[n] for n in LOG_LEVEL_ENV if os.environ.get(n)), None)
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
