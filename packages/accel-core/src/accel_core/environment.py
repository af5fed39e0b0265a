"""The launch protocol: the ``ACCEL_*`` environment variables a launcher writes and the state reads.

This module must not import torch: the command line uses it to build a child environment.
Every setting has one name here so the launcher, the config file and the state agree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

PREFIX = "ACCEL_"

# Settings of the Accelerator that a launcher or config file may fix.
MIXED_PRECISION = "ACCEL_MIXED_PRECISION"  # "no" | "fp16" | "bf16" | "fp8"
GRADIENT_ACCUMULATION_STEPS = "ACCEL_GRADIENT_ACCUMULATION_STEPS"
USE_CPU = "ACCEL_USE_CPU"  # "true" forces the CPU even where a GPU exists
DYNAMO_BACKEND = "ACCEL_DYNAMO_BACKEND"  # "no" or a torch.compile backend name
# TorchDynamoPlugin's other fields, read when the script leaves them unset (Accelerate's --dynamo_* launch flags).
DYNAMO_MODE = "ACCEL_DYNAMO_MODE"  # torch.compile(mode=): "default", "reduce-overhead", "max-autotune", ...
DYNAMO_USE_FULLGRAPH = "ACCEL_DYNAMO_USE_FULLGRAPH"  # boolean: torch.compile(fullgraph=)
DYNAMO_USE_DYNAMIC = "ACCEL_DYNAMO_USE_DYNAMIC"  # boolean: torch.compile(dynamic=)
DYNAMO_USE_REGIONAL_COMPILATION = "ACCEL_DYNAMO_USE_REGIONAL_COMPILATION"  # boolean: compile block by block
DEBUG_MODE = "ACCEL_DEBUG_MODE"  # "1"/"true": torch's collective consistency checks (TORCH_DISTRIBUTED_DEBUG=DETAIL)
COLLECTIVE_TIMEOUT = "ACCEL_COLLECTIVE_TIMEOUT"  # seconds a collective waits for every rank (process group timeout)
STALL_REPORT_AFTER = "ACCEL_STALL_REPORT_AFTER"  # seconds in one collective before the stall report; 0: off
# The folder `accel launch` gives its workers for what its failure summary reads (finish records, stall findings).
FINISH_RECORDS = "ACCEL_FINISH_RECORDS"
TORCH_DISTRIBUTED_DEBUG = "TORCH_DISTRIBUTED_DEBUG"  # torch's own: OFF / INFO / DETAIL
STRATEGY = "ACCEL_STRATEGY"  # name of an ``accel.strategies`` entry point: "ddp", "fsdp", "deepspeed", ...
CONFIG_FILE = "ACCEL_CONFIG_FILE"  # path of the YAML config file
SCHEDULER_STEPPING = "ACCEL_SCHEDULER_STEPPING"  # "per_process" (as Accelerate) | "per_optimizer_step"
# "true" (set by a backend's launch flags, e.g. --use-xla): the mesh sizes count the devices one process drives
# (SPMD), so `accel launch` does not check them against --num-processes; the strategy checks them in the process.
MESH_OVER_DEVICES = "ACCEL_MESH_OVER_DEVICES"
AUTO_RESUME = "ACCEL_AUTO_RESUME"  # "1"/"true": Accelerator(resume="auto") unless the script passes resume=
# An elastic job's processes when all its machines take part (`accel launch --keep-global-batch`): a smaller
# world multiplies gradient accumulation by GLOBAL_BATCH_PROCESSES / WORLD_SIZE to keep the global batch.
GLOBAL_BATCH_PROCESSES = "ACCEL_GLOBAL_BATCH_PROCESSES"
# The mesh sizes travel as ACCEL_<DIM>_SIZE (ACCEL_TP_SIZE, ...): see ``accel_core.parallel.config.ENV_VARS``.
# A backend's own options travel as ACCEL_<BACKEND>_<OPTION>, e.g. ACCEL_FSDP_SHARDING_STRATEGY;
# the backend package reads them in its plugin's ``from_env``.

# torchrun's variables, read as they are.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"  # torchrun: the number of machines (agents) in the job
GROUP_RANK = "GROUP_RANK"  # torchrun: this machine's rank among them
# `accel launch --main-process-ip` of a multi-machine job: a loopback one means all "machines" share this one.
MAIN_PROCESS_IP = "ACCEL_MAIN_PROCESS_IP"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"  # gloo's network interface(s); unset: the host name's address
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # attempts before this one (0 in the first)
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "True": the agent serves the store at MASTER_ADDR:PORT

_TRUE = {"1", "true", "yes", "on", "y", "t"}  # "y" and "t" too, as Accelerate's str_to_bool
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def parse_flag(value: str | None, default: bool = False) -> bool:
    """Reads a boolean written by a person or a launcher ("1", "true", "yes", "on", or their opposites)."""
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"Cannot read {value!r} as a boolean: use one of {sorted(_TRUE | _FALSE - {''})}.")


def flag(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """The boolean environment variable ``name``."""
    env = os.environ if environ is None else environ
    try:
        return parse_flag(env.get(name), default)
    except ValueError as error:
        raise ValueError(f"Environment variable {name}: {error}") from None


def get_int(name: str, default: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """The integer environment variable ``name``, or ``default`` when unset."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"Environment variable {name}={raw!r} must be an integer.") from None


def get_seconds(name: str, environ: Mapping[str, str] | None = None) -> float | None:
    """The positive number of seconds in the environment variable ``name``, or ``None`` when unset."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"Environment variable {name}={raw!r} must be a positive number of seconds, e.g. 600.")
    return seconds


def get_str(name: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The string environment variable ``name``, or ``default`` when unset or empty."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    return default if raw is None or raw == "" else raw


def backend_options(backend: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """All ``ACCEL_<BACKEND>_<OPTION>`` variables as ``{"option": value}`` (lower-case option names)."""
    env = os.environ if environ is None else environ
    prefix = f"{PREFIX}{backend.upper()}_"
    return {key[len(prefix) :].lower(): value for key, value in env.items() if key.startswith(prefix)}


def parse_backend_options(
    backend: str,
    table: Mapping[str, tuple[str, Callable[[str], Any]]],
    environ: Mapping[str, str] | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """A plugin's keyword arguments from the ``ACCEL_<BACKEND>_*`` variables.

    ``table`` maps each option (lower-case) to ``(plugin field, parser)``. A value its parser
    rejects (ValueError), or an option not in the table, raises ValueError naming the variable.

    Example: with ``ACCEL_FSDP_VERSION=1``, ``parse_backend_options("fsdp", {"version": ("fsdp_version", int)})``
    gives ``{"fsdp_version": 1}``.
    """
    prefix = f"{PREFIX}{backend.upper()}_"
    kwargs: dict[str, Any] = {}
    unknown = []
    for option, raw in backend_options(backend, environ).items():
        spec = table.get(option)
        if spec is None:
            unknown.append(option)
            continue
        name, parse = spec
        try:
            kwargs[name] = parse(raw)
        except ValueError as error:
            raise ValueError(f"Environment variable {prefix}{option.upper()}={raw!r}: {error}") from None
    if unknown:
        known = ", ".join(sorted(prefix + o.upper() for o in table))
        raise ValueError(
            f"Unknown {label or backend} option(s) {', '.join(prefix + u.upper() for u in sorted(unknown))} "
            f"(from the environment or the config file's {backend} section). Known: {known}."
        )
    return kwargs
