"""From flags, environment and config file to one launch plan: a pure function, no processes, no torch.

Precedence, setting by setting: command-line flag > ``ACCEL_*`` variable already in the caller's
environment > config file > default. Settings without an ``ACCEL_*`` name (the process layout)
skip the environment step. The plan also carries the environment the launched processes get.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from accel_core import environment as env

from . import rendezvous
from .rendezvous import RDZV_STORE_SHARING_OFF
from .settings import (
    CONFIG,
    DEFAULT,
    ENVIRONMENT,
    FLAG,
    MESH_SETTINGS,
    SETTINGS,
    SETTINGS_BY_NAME,
    MachineRange,
    coerce,
    origin,
)


@dataclass(frozen=True)
class LaunchTarget:
    """What to run: a script path (``module=False``) or a module name, and its arguments."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    """The resolved settings of one launch, where each came from, and the workers' extra environment.

    ``env`` holds only what the launcher adds to the caller's environment (``ACCEL_*`` settings,
    backend options, ``--env`` pairs, ``OMP_NUM_THREADS``); the workers see the caller's
    environment updated with it.

    ``num_machines`` is the most machines of the job and ``min_machines`` the fewest it runs on
    (``None``: a fixed number, all of them); ``num_processes`` counts the processes when all
    ``num_machines`` take part.

    ``torchrun_options`` are torchrun's own flags passed on as given (``--redirects=3``, ...;
    accel_launch.torchrun_flags): they tune its agent and are not settings of a config file.
    """

    num_processes: int = 1
    num_machines: int = 1
    min_machines: int | None = None
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    rdzv_conf: str | None = None
    max_restarts: int = 0
    keep_global_batch: bool = False
    auto_resume: bool = False
    monitor_interval: float | None = None
    log_dir: str | None = None
    tee: str | None = None
    use_cpu: bool = False
    mixed_precision: str = "no"
    gradient_accumulation_steps: int = 1
    dynamo_backend: str = "no"
    debug: bool = False
    collective_timeout: float | None = None
    stall_report_after: float | None = None
    strategy: str | None = None
    scheduler_stepping: str | None = None
    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    pp_size: int | None = None
    pp_schedule: str | None = None
    pp_microbatches: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    config_file: str | None = None
    torchrun_options: tuple[str, ...] = ()

    @property
    def nproc_per_node(self) -> int:
        return self.num_processes // self.num_machines

    @property
    def elastic(self) -> bool:
        """Whether the job continues on fewer machines than ``num_machines`` (``--num-machines MIN:MAX``)."""
        return self.min_machines is not None and self.min_machines != self.num_machines

    @property
    def nnodes(self) -> str:
        """torchrun's ``--nnodes``: ``N`` or ``MIN:MAX``."""
        return f"{self.min_machines}:{self.num_machines}" if self.elastic else str(self.num_machines)

    @property
    def uses_torchrun(self) -> bool:
        """Whether the job needs torchrun's agent: several processes or machines, or restarts.

        One process on one machine without restarts or log files runs the script directly: no agent, no
        rendezvous, and no ``RANK``/``WORLD_SIZE`` set, so the state sees a plain single process.
        """
        return self.num_processes > 1 or self.num_machines > 1 or self.max_restarts > 0 or self.log_dir is not None

    def settings(self) -> dict[str, Any]:
        """The settings as a plain dict (config-file keys); ``num_machines`` as ``"MIN:MAX"`` when elastic."""
        values = {s.name: getattr(self, s.name) for s in SETTINGS}
        if self.elastic:
            values["num_machines"] = self.nnodes
        return values


def encode_env_value(value: Any) -> str:
    """How a config value travels in an environment variable: booleans as true/false, containers as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def backend_env_var(backend: str, option: str) -> str:
    """``ACCEL_<BACKEND>_<OPTION>``, upper-cased, dashes made underscores."""
    return f"{env.PREFIX}{backend}_{option}".upper().replace("-", "_")


def resolve_plan(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config: Mapping[str, Any],
    *,
    flag_env: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    config_file: str | None = None,
    cpu_count: int | None = None,
    processes_per_machine: int | None = None,
) -> LaunchPlan:
    """Resolves every launch setting: flag > ``ACCEL_*`` environment > config file > default.

    Args:
        flags: setting name -> value given on the command line (``None`` or absent: not given).
        environ: the caller's environment (read, never changed).
        config: the parsed config file (``{}`` when there is none).
        flag_env: variables from the command line (backend flags, ``--env``); they win over all.
        defaults: replaces the built-in defaults of some settings (``accel test`` runs 2 CPU processes).
        config_file: path of the config file, for messages.
        cpu_count: CPUs of this machine (sizes ``OMP_NUM_THREADS``); ``None`` reads ``os.cpu_count()``.
        processes_per_machine: torchrun's ``--nproc-per-node``, given instead of ``num_processes``: the job has
            that many on each of its (most) machines.

    Example::

        plan = resolve_plan({"num_processes": 2, "use_cpu": True}, os.environ, {})
        assert plan.nproc_per_node == 2 and plan.env["ACCEL_USE_CPU"] == "true"
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        default = (defaults or {}).get(setting.name, setting.default)
        candidates = (
            (FLAG, flags.get(setting.name)),
            (ENVIRONMENT, environ.get(setting.env_var) or None if setting.env_var else None),
            (CONFIG, config.get(setting.name)),
        )
        source, raw = next(((s, v) for s, v in candidates if v is not None), (DEFAULT, default))
        values[setting.name] = coerce(setting, raw, origin(setting, source, config_file))
        sources[setting.name] = source
    machines = MachineRange.parse(values["num_machines"])
    values["num_machines"], values["min_machines"] = machines.maximum, machines.minimum if machines.elastic else None
    if processes_per_machine is not None:
        values["num_processes"], sources["num_processes"] = processes_per_machine * machines.maximum, FLAG
    mesh_over_devices = env.flag(env.MESH_OVER_DEVICES, environ={**environ, **(flag_env or {})})
    _validate(values, sources, config_file, mesh_over_devices)
    rendezvous.choose_backend(values, sources, config_file)
    rendezvous.check_conf(values, sources, config_file)

    child_env: dict[str, str] = {}
    # Lowest first: config file sections, then the resolved settings, then the command line's pairs.
    for key, value in (config.get("env") or {}).items():
        if key not in environ and value is not None:
            child_env[str(key)] = encode_env_value(value)
    for section, options in config.items():
        if isinstance(options, Mapping) and section != "env":
            for option, value in options.items():
                name = backend_env_var(section, str(option))
                if name not in environ and value is not None:
                    child_env[name] = encode_env_value(value)
    for setting in SETTINGS:
        if setting.env_var and values[setting.name] is not None:
            child_env[setting.env_var] = encode_env_value(values[setting.name])
    child_env.update(flag_env or {})
    if values["debug"] and env.TORCH_DISTRIBUTED_DEBUG not in environ and env.TORCH_DISTRIBUTED_DEBUG not in child_env:
        # Debug mode also turns on torch's checks that every rank calls the same collective.
        child_env[env.TORCH_DISTRIBUTED_DEBUG] = "DETAIL"
    if values["max_restarts"] > 0 and RDZV_STORE_SHARING_OFF not in environ and RDZV_STORE_SHARING_OFF not in child_env:
        # torchrun's c10d rendezvous keeps one TCPStore server for all attempts, and the workers'
        # init_process_group reuses it with no per-attempt prefix: a restarted worker can read a key
        # of the attempt before (a dead peer's address) and wait in gloo/NCCL set-up until killed
        # (pytorch/pytorch#135712; 2 of 8 restarts here). Without sharing, each attempt's rank 0
        # serves a fresh store. The agent reads it too: `launch` applies this env to its own process.
        child_env[RDZV_STORE_SHARING_OFF] = "1"
    if values["num_machines"] > 1 and values["main_process_ip"]:
        # The workers refuse a loopback address across machines (accel_core.network_check) unless this is one.
        child_env[env.MAIN_PROCESS_IP] = str(values["main_process_ip"])
    if values["keep_global_batch"] and values["min_machines"] is not None:
        # The data-parallel world the user's batch and accumulation are meant for: all MAX machines.
        child_env[env.GLOBAL_BATCH_PROCESSES] = str(values["num_processes"])
    nproc_per_node = values["num_processes"] // values["num_machines"]
    if nproc_per_node > 1 and "OMP_NUM_THREADS" not in environ and "OMP_NUM_THREADS" not in child_env:
        # torchrun would set 1 (and print a warning box); share this machine's CPUs instead.
        cpus = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
        child_env["OMP_NUM_THREADS"] = str(max(1, cpus // nproc_per_node))
    return LaunchPlan(**values, env=child_env, sources=sources, config_file=config_file)


def _validate(
    values: dict[str, Any], sources: dict[str, str], config_file: str | None, mesh_over_devices: bool = False
) -> None:
    def where(name: str) -> str:
        return origin(SETTINGS_BY_NAME[name], sources[name], config_file)

    for name in ("num_processes", "num_machines", "gradient_accumulation_steps"):
        if values[name] < 1:
            raise ValueError(f"{where(name)}: {name} must be at least 1, got {values[name]}.")
    if values["min_machines"] is not None and not 1 <= values["min_machines"] <= values["num_machines"]:
        raise ValueError(
            f"{where('num_machines')}: MIN:MAX needs 1 <= MIN <= MAX, got "
            f"{values['min_machines']}:{values['num_machines']}; e.g. --num-machines 1:{values['num_machines']}."
        )
    if values["max_restarts"] < 0:
        raise ValueError(f"{where('max_restarts')}: max_restarts must be 0 or more.")
    if values["collective_timeout"] is not None and values["collective_timeout"] <= 0:
        raise ValueError(f"{where('collective_timeout')}: collective_timeout must be a positive number of seconds.")
    if values["stall_report_after"] is not None and values["stall_report_after"] < 0:
        raise ValueError(f"{where('stall_report_after')}: stall_report_after must be 0 (off) or a number of seconds.")
    if values["monitor_interval"] is not None and values["monitor_interval"] <= 0:
        raise ValueError(f"{where('monitor_interval')}: monitor_interval must be a positive number of seconds.")
    machines, processes = values["num_machines"], values["num_processes"]
    if processes % machines:
        elastic = values["min_machines"] is not None
        raise ValueError(
            f"num_processes ({processes}, {where('num_processes')}) counts the processes of all "
            f"{f'{machines} (MAX) ' if elastic else ''}machines and must be a multiple of "
            f"{'MAX' if elastic else 'num_machines'} ({machines}), the same number on each machine; e.g. "
            f"--num-processes {machines * max(1, processes // machines)} for {max(1, processes // machines)} per "
            "machine."
        )
    if values["min_machines"] is not None and machines > 1 and not values["main_process_ip"]:
        raise ValueError(
            "An elastic job (--num-machines MIN:MAX) meets at a rendezvous on one machine: pass --main-process-ip "
            "<its address> and the same --main-process-port on every machine."
        )
    if not 0 <= values["machine_rank"] < machines:
        raise ValueError(
            f"{where('machine_rank')}: machine_rank must be between 0 and num_machines - 1 = {machines - 1}, "
            f"got {values['machine_rank']}."
        )
    if machines > 1 and not values["main_process_ip"]:
        raise ValueError(
            "Several machines need the address of the main one: pass --main-process-ip <address of machine 0> "
            "(and the same --main-process-port on every machine)."
        )
    tee = values["tee"]
    if tee is not None and not re.fullmatch(r"[0-3]|\d+:[0-3](,\d+:[0-3])*", tee):
        raise ValueError(
            f"{where('tee')}: tee={tee!r}; use 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank, e.g. "
            "0:3,1:2."
        )
    port = values["main_process_port"]
    if port is not None and not 0 <= port < 65536:
        raise ValueError(f"{where('main_process_port')}: {port} is not a TCP port.")
    if port == 0 and machines > 1:
        raise ValueError(
            f"{where('main_process_port')}: 0 (a free port) works on one machine only; several machines need the "
            "same fixed port, e.g. 29500."
        )
    if port == 0:
        values["main_process_port"] = None  # one machine: torchrun picks a free port by itself
    _validate_mesh(values, where, mesh_over_devices)


def _validate_mesh(values: dict[str, Any], where: Any, over_devices: bool = False) -> None:
    """Mesh sizes must be >= 1 and fit the processes (checked again, with the strategy, in each process).

    over_devices: the backend lays the mesh over the devices each process drives (XLA's SPMD), which
    only the process knows: the sizes are not checked against the number of processes here.
    """
    given = {name: values[name] for name in MESH_SETTINGS if values[name] is not None}
    for name, size in given.items():
        if size < 1:
            raise ValueError(f"{where(name)}: {name} must be at least 1, got {size}.")
    if over_devices:
        return
    product, processes = 1, values["num_processes"]
    for size in given.values():
        product *= size
    both_dp = "dp_replicate_size" in given and "dp_shard_size" in given
    if processes % product or (both_dp and product != processes):
        sizes = " x ".join(f"{name}={size}" for name, size in given.items())
        need = f"equal {processes}" if both_dp else f"divide {processes}"
        raise ValueError(
            f"The mesh sizes {sizes} (product {product}) must {need}, the number of processes (--num-processes). "
            "Leave a data-parallel size unset to fill the rest."
        )


def parse_env_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (from ``--env``) as a dict; a pair without ``=`` is an error."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {pair!r}: write KEY=VALUE, e.g. --env NCCL_DEBUG=INFO.")
        result[key] = value
    return result


def torchrun_argv(plan: LaunchPlan, target: LaunchTarget, scratch: str | None = None) -> list[str]:
    """The arguments of ``torch.distributed.run`` (torchrun) for ``plan``.

    Each worker runs ``python -m accel_launch.runner path|module <target> <args>``, which
    runs the target as ``python <script>`` / ``python -m <module>`` would and records a failure's
    traceback where the agent reads it.

    scratch: a folder removed when the launch ends. Where no output is to be kept (no ``--log-dir``,
    ``--tee`` or ``--redirects``), the agent's log folder, which then only holds the workers' error
    files, goes there: torch's agent otherwise makes a ``torchelastic_*`` folder in the temporary
    directory per job and never removes it.

    Example::

        torchrun_argv(resolve_plan({"num_processes": 2}, {}, {}), LaunchTarget("train.py"))
        # ['--nnodes=1', '--nproc-per-node=2', '-m', 'accel_launch.runner', 'path', 'train.py']
    """
    argv = [f"--nnodes={plan.nnodes}", f"--nproc-per-node={plan.nproc_per_node}"]
    if plan.max_restarts:
        argv.append(f"--max-restarts={plan.max_restarts}")
    if plan.monitor_interval is not None:
        argv.append(f"--monitor-interval={plan.monitor_interval}")
    if plan.log_dir is not None:
        # Without --tee torchrun would only put error files there: a log folder asked for gets the output.
        argv += [f"--log-dir={plan.log_dir}", f"--tee={plan.tee or '3'}"]
    elif plan.tee is not None:
        argv.append(f"--tee={plan.tee}")
    elif scratch is not None and not any(option.startswith("--redirects=") for option in plan.torchrun_options):
        argv.append(f"--log-dir={os.path.join(scratch, 'agent')}")
    argv += rendezvous.torchrun_arguments(plan)
    argv += plan.torchrun_options
    argv += ["-m", "accel_launch.runner", "module" if target.module else "path", target.script]
    return argv + list(target.args)
