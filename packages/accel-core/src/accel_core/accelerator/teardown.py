"""The one exit hook that tears down the strategies still alive when the interpreter exits.

``Strategy.teardown`` is called by the Accelerator's ``free_memory``. A script that never calls it has its
strategy torn down here, once, at exit, if the strategy is still alive then (a script's module-level
``accelerator``): the script's globals (``model, optimizer = accelerator.prepare(...)``) keep an engine
alive until Python finalizes modules, after every exit hook, where native state freed in an arbitrary order
can abort a run that succeeded (DeepSpeed's CPU Adam: SIGABRT, "terminate called without an active
exception"). This hook is moved to the end of the ``atexit`` list each time an Accelerator is made, so it
runs before the exit hooks registered earlier, the process state's among them (which destroys the process
groups an engine may still reference).

Strategies are held weakly: one collected before exit (with its Accelerator: a test's, a notebook cell's)
was freed by the garbage collector while the interpreter was whole, its native objects through their own
destructors, so nothing is left to tear down, and holding it here would keep its Accelerator and every
prepared object alive until the end of the process.

Backends register no exit hooks of their own (tests/packaging/test_no_exit_hooks.py); ``teardown`` is
idempotent, so a ``free_memory`` before exit makes this call a harmless second one.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..strategies import Strategy

logger = logging.getLogger(__name__)

# The strategies of the Accelerators made in this process, oldest first; pruned of collected ones as more come.
_STRATEGIES: list[weakref.ref[Strategy]] = []


def tear_down_at_exit(strategy: Strategy) -> None:
    """Calls ``strategy.teardown()`` at interpreter exit if ``strategy`` is still alive then (see the module doc)."""
    _STRATEGIES[:] = [ref for ref in _STRATEGIES if ref() is not None and ref() is not strategy]
    _STRATEGIES.append(weakref.ref(strategy))
    atexit.unregister(_tear_down_at_exit)  # to the end of the list: runs before the hooks registered so far
    atexit.register(_tear_down_at_exit)


def _tear_down_at_exit() -> None:
    # Newest first, as atexit would order separate hooks.
    alive = [strategy for strategy in (ref() for ref in reversed(_STRATEGIES)) if strategy is not None]
    _STRATEGIES.clear()
    for strategy in alive:
        try:
            strategy.teardown()
        except Exception:  # the others still get theirs; the traceback is shown, the exit code stays the script's
            logger.exception("%r failed to tear down at exit", strategy)
