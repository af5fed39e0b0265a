"""accel-launch: starting jobs. The logic behind ``accel launch``, the config file, and the notebook/debug launchers.

Nothing here imports torch at import time (the ``accel`` command line stays fast); torch is
imported only when a job with several processes actually starts. The workers' side is
``accel_launch.runner``; what the workers read at run time (the ``ACCEL_*`` environment, the
cluster environment, preemption, the attempt store) is accel-core's.

How a launch works
    1. ``config.load_config`` finds and reads the YAML config file (``--config-file`` >
       ``$ACCEL_CONFIG_FILE`` > ``$XDG_CONFIG_HOME/accel/default_config.yaml``).
    2. ``plan.resolve_plan(flags, os.environ, config)`` is the one pure function that decides each
       setting (flag > ``ACCEL_*`` environment > config file > default) and the workers' extra
       environment: ``ACCEL_MIXED_PRECISION``, ``ACCEL_GRADIENT_ACCUMULATION_STEPS``,
       ``ACCEL_USE_CPU``, ``ACCEL_DYNAMO_BACKEND``, ``ACCEL_DEBUG_MODE``, ``ACCEL_STRATEGY``, the mesh
       sizes ``ACCEL_DP_REPLICATE_SIZE`` / ``ACCEL_DP_SHARD_SIZE`` / ``ACCEL_TP_SIZE`` / ``ACCEL_CP_SIZE`` /
       ``ACCEL_PP_SIZE`` (when given), and ``ACCEL_<BACKEND>_<OPTION>`` for each option of a backend
       section of the config file.
    3. ``run.launch(plan, target)``: one process on one machine without restarts runs
       ``python script.py`` directly (no ``RANK``/``WORLD_SIZE``: a plain single process); anything
       else runs torchrun's elastic agent (``torch.distributed.run``) in this process, whose
       workers run ``python -m accel_launch.runner`` so a failing rank's traceback reaches
       the launcher. ``num_processes`` counts all machines' processes, as in Accelerate.

Backend flags: the ``accel.cli`` entry-point group
    A backend package adds its own ``accel launch`` flags by registering an object (or a class
    or factory building one) with ``name``, ``add_arguments(group)`` and ``to_env(namespace) ->
    dict[str, str]`` (accel-core's ``accel_core.launch_options.LaunchExtension``, so a backend needs
    accel-core alone; ``extensions`` here loads them)::

        [project.entry-points."accel.cli"]
        fsdp = "accel_fsdp.cli:FSDPLaunchOptions"

    Its flags default to ``None`` and ``to_env`` returns variables only for flags that were
    given; they win over the environment and the config file. Its config-file section (the
    mapping under its ``name``) reaches the workers as ``ACCEL_<NAME>_<OPTION>`` without any
    code. The module must not import torch or the backend's library.

Example::

    from accel_launch import LaunchTarget, launch, load_config, resolve_plan

    config, path = load_config()
    plan = resolve_plan({"num_processes": 2, "use_cpu": True}, os.environ, config)
    exit_code = launch(plan, LaunchTarget("train.py"))
"""

from __future__ import annotations

from accel_core.lazy import lazy_exports

__version__ = "0.1.0"

# Public name -> submodule; loaded on first use so `python -m accel_launch.runner` stays light.
_EXPORTS = {
    "LaunchPlan": "plan",
    "LaunchTarget": "plan",
    "SETTINGS": "plan",
    "resolve_plan": "plan",
    "torchrun_argv": "plan",
    "parse_env_pairs": "plan",
    "default_config_path": "config",
    "config_path": "config",
    "load_config": "config",
    "read_config": "config",
    "write_config": "config",
    "dump_config": "config",
    "convert_accelerate_config": "accelerate_import",
    "LaunchExtension": "extensions",
    "load_extensions": "extensions",
    "add_extension_arguments": "extensions",
    "extension_env": "extensions",
    "JobFailedError": "failures",
    "LaunchedFunctionFailed": "child_failed",
    "launch": "run",
    "notebook_launcher": "notebook",
    "debug_launcher": "notebook",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), {name: f".{module}" for name, module in _EXPORTS.items()})
