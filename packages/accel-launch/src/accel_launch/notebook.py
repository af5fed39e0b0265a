"""Launching a function (not a script) on several processes: from a notebook, or in tests.

Both launchers run torch's elastic agent in this process (``elastic_launch``) with the function
as the workers' entrypoint; workers are forked where the platform can, because a function defined
in a notebook cannot be imported by a freshly spawned interpreter. Torch is imported when called.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from accel_core import environment as env

from .plan import encode_env_value
from .run import patched_environ, preserved_signal_handlers


def _check_parent_is_clean(uses_cuda: bool) -> None:
    """Forked workers inherit this process: it must not hold a process state or a CUDA context yet."""
    state_module = sys.modules.get("accel_core.state")
    if state_module is not None and state_module.PartialState.is_initialized():
        raise ValueError(
            "An Accelerator (or PartialState) already exists in this process, so the launched processes would "
            "inherit it: create the Accelerator inside the function you launch, and restart the notebook kernel."
        )
    torch = sys.modules.get("torch")
    if uses_cuda and torch is not None and torch.cuda.is_initialized():
        raise ValueError(
            "CUDA was initialized in this process before launching, and forked processes cannot use it: restart "
            "the kernel and keep every CUDA call (even torch.cuda.device_count()) inside the launched function."
        )


class _NotesItsReturn:
    """The launched function, noting in the agent's store that it returned on this rank.

    A peer still waiting for this rank to set up the process group (``PartialState()``) then stops with an
    error naming it, and the agent restarts the attempt or reports the failure; without the note that peer waits
    until the group timeout, and the agent with it (``accel_core.attempt_store``). A class, not a closure: the
    ``spawn`` start method pickles it.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        # torch's agent names the entrypoint in its logs and events (__name__, __qualname__).
        self.__name__ = getattr(function, "__name__", type(function).__name__)
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)

    def __call__(self, *args: Any) -> Any:
        result = self.function(*args)
        from accel_core.attempt_store import note_returned

        note_returned(int(os.environ.get(env.RANK, "0")))
        return result


@contextlib.contextmanager
def _quiet_failure_log() -> Iterator[None]:
    """Mutes the agent's own report of a failed function (LaunchedFunctionFailed says it shorter).

    That report is logged with ``exc_info``, which makes torch's log formatter import
    ``torch._dynamo``: seconds of delay before the error reaches the caller.
    """
    logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _run_elastic(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    num_processes: int,
    settings: Mapping[str, str],
    *,
    master_addr: str,
    port: int | None,
    node_rank: int,
    num_nodes: int,
    rdzv_backend: str,
    rdzv_endpoint: str,
    rdzv_conf: Mapping[str, Any] | None,
    rdzv_id: str,
    max_restarts: int,
    monitor_interval: float,
    start_method: str | None,
    log_line_prefix_template: str | None = None,
) -> list[Any]:
    import torch.multiprocessing as mp
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from .child_failed import LaunchedFunctionFailed

    if start_method is None:
        start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    rdzv_configs = dict(rdzv_conf or {})
    run_id = rdzv_id
    if rdzv_backend == "static" and port is None:
        if num_nodes > 1:
            raise ValueError("Several machines need the same use_port on each of them, e.g. use_port=29500.")
        # As torchrun does on one machine: a c10d store on a free port, no port to choose or collide on.
        rdzv_backend, endpoint, run_id = "c10d", "localhost:0", str(uuid.uuid4())
    elif rdzv_backend == "static":
        rdzv_configs["rank"] = node_rank
        endpoint = f"{master_addr}:{port}"
    else:
        endpoint = rdzv_endpoint or f"{master_addr}:{port or 29500}"
    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=num_processes,
        run_id=run_id,
        rdzv_endpoint=endpoint,
        rdzv_backend=rdzv_backend,
        rdzv_configs=rdzv_configs,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method=start_method,
        log_line_prefix_template=log_line_prefix_template,
    )
    with patched_environ(settings), preserved_signal_handlers(), _quiet_failure_log():
        try:
            results = elastic_launch(config, _NotesItsReturn(function))(*args)
        except ChildFailedError as error:
            raise LaunchedFunctionFailed(
                error, world_size=num_processes * num_nodes, restarts=max_restarts, monitor_interval=monitor_interval
            ) from None
    return [results[rank] for rank in sorted(results)]


def notebook_launcher(
    function: Callable[..., Any],
    args: tuple[Any, ...] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int | None = None,
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: Mapping[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    use_cpu: bool = False,
    start_method: str | None = None,
    log_line_prefix_template: str | None = None,
) -> list[Any]:
    """Runs ``function(*args)`` on ``num_processes`` processes of this machine and returns their results by rank.

    ``num_processes=None`` uses one process per CUDA GPU, or runs the function right here when there
    are fewer than two. Create the ``Accelerator`` inside ``function``; nothing in this process may
    have touched CUDA before. ``use_port=None`` picks a free port (several machines must agree on
    one). ``log_line_prefix_template`` is torchrun's (``"[${rank}]: "``; also ``${role_name}``,
    ``${local_rank}``, ``${hostname}``) for the workers' log lines. A failed process raises
    ``LaunchedFunctionFailed``, a torch ``ChildFailedError`` (and accel ``JobFailedError``) naming its
    rank, with its traceback.

    Example::

        def train(lr):
            accelerator = Accelerator()
            ...

        notebook_launcher(train, args=(1e-3,), num_processes=2)
    """
    import torch

    if num_processes is None:
        num_processes = torch.cuda.device_count() if torch.cuda.is_available() and not use_cpu else 1
    settings = {env.MIXED_PRECISION: str(mixed_precision).lower()}
    if use_cpu:
        settings[env.USE_CPU] = encode_env_value(True)
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}.")
    if num_processes == 1 and num_nodes == 1:
        with patched_environ(settings):
            return [function(*args)]
    _check_parent_is_clean(uses_cuda=not use_cpu and torch.cuda.is_available())
    return _run_elastic(
        function,
        tuple(args),
        num_processes,
        settings,
        master_addr=master_addr,
        port=int(use_port) if use_port is not None else None,
        node_rank=node_rank,
        num_nodes=num_nodes,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_conf=rdzv_conf,
        rdzv_id=rdzv_id,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method=start_method,
        log_line_prefix_template=log_line_prefix_template,
    )


def debug_launcher(function: Callable[..., Any], args: tuple[Any, ...] = (), num_processes: int = 2) -> list[Any]:
    """Runs ``function(*args)`` on ``num_processes`` CPU processes (gloo) and returns their results by rank.

    For tests of distributed code on a machine without accelerators.

    Example::

        def check():
            state = PartialState()
            assert state.num_processes == 2

        debug_launcher(check)
    """
    _check_parent_is_clean(uses_cuda=False)
    return _run_elastic(
        function,
        tuple(args),
        num_processes,
        {env.USE_CPU: "true"},
        master_addr="127.0.0.1",
        port=None,
        node_rank=0,
        num_nodes=1,
        rdzv_backend="static",
        rdzv_endpoint="",
        rdzv_conf=None,
        rdzv_id="none",
        max_restarts=0,
        monitor_interval=0.1,
        start_method=None,
    )
