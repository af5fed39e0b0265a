"""The launcher moved out of accel-core: ``accel launch``, the launch plan, config files, the notebook / debug
launchers and the worker entry are the accel-launch distribution (``accel_launch``), installed with ``accel``.

accel-core keeps what a backend and the workers need: the contract a backend uses to add its ``accel launch``
flags (``accel_core.launch_options``; ``accel_core.launch.extensions`` re-exports it for backends written
against the old path) and the run-time side of a launch (``environment``, ``cluster_env``, ``preemption``,
``attempt_store``). accel-core does not import accel-launch, so the old names are not forwarded; asking for
one says where it went.
"""

from __future__ import annotations

# The names this package exported before the move (all now in accel_launch).
_MOVED = frozenset(
    {
        "LaunchPlan", "LaunchTarget", "SETTINGS", "resolve_plan", "torchrun_argv", "parse_env_pairs",
        "default_config_path", "config_path", "load_config", "read_config", "write_config", "dump_config",
        "convert_accelerate_config", "load_extensions", "add_extension_arguments", "extension_env",
        "JobFailedError", "LaunchedFunctionFailed", "launch", "notebook_launcher", "debug_launcher",
    }
)  # fmt: skip


def __getattr__(name: str) -> object:
    if name in _MOVED:
        # ImportError, not AttributeError: `from accel_core.launch import launch` then shows this message.
        raise ImportError(
            f"accel_core.launch.{name} moved to the accel-launch distribution (installed with accel): "
            f"from accel_launch import {name}"
        )
    raise AttributeError(f"module 'accel_core.launch' has no attribute {name!r}")
