"""The launch settings: each one's name, type, default, ``ACCEL_*`` variable and help, and how a value is read.

A setting's value comes from a flag, an ``ACCEL_*`` variable, a config file or its default
(``accel_launch.plan`` resolves them); ``origin`` names where, for messages that say what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from accel_core import environment as env
from accel_core.enums import DynamoBackend, PrecisionType, SchedulerStepping

FLAG = "flag"
ENVIRONMENT = "environment"
CONFIG = "config file"
DEFAULT = "default"


@dataclass(frozen=True)
class MachineRange:
    """``--num-machines``: N machines, or MIN:MAX for an elastic job (torchrun's ``--nnodes=MIN:MAX``)."""

    minimum: int
    maximum: int

    @classmethod
    def parse(cls, value: Any) -> MachineRange:
        """From an integer, ``"N"`` or ``"MIN:MAX"``; ``ValueError`` (without the origin) otherwise."""
        if isinstance(value, MachineRange):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value, value)
        match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f"expected a number of machines N or a range MIN:MAX such as 1:4, got {value!r}.")
        low = int(match.group(1))
        return cls(low, int(match.group(2)) if match.group(2) is not None else low)

    @property
    def elastic(self) -> bool:
        return self.minimum != self.maximum

    def __str__(self) -> str:
        return f"{self.minimum}:{self.maximum}" if self.elastic else str(self.maximum)


@dataclass(frozen=True)
class Setting:
    """One launch setting: its name (flag dest and config key), type, default and ``ACCEL_*`` variable."""

    name: str
    kind: type
    default: Any
    env_var: str | None = None
    choices: tuple[str, ...] | None = None
    help: str = ""


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "num_processes",
        int,
        1,
        help="processes in total, over all machines (an elastic job: over MAX machines, the same number on each)",
    ),
    Setting(
        "num_machines",
        MachineRange,
        1,
        help="machines taking part: N, or MIN:MAX for an elastic job that continues on MIN to MAX machines",
    ),
    Setting("machine_rank", int, 0, help="index of this machine, 0 for the main one"),
    Setting("main_process_ip", str, None, help="address of the machine of rank 0 (several machines)"),
    Setting("main_process_port", int, None, help="port of the rendezvous on the main machine"),
    Setting(
        "rdzv_backend",
        str,
        "static",
        help="torchrun rendezvous backend of several machines: static (default), c10d (the default with "
        "--max-restarts or MIN:MAX machines: a lost machine's agent can rejoin), etcd, ...",
    ),
    Setting(
        "rdzv_conf",
        str,
        None,
        help="torchrun's rendezvous settings, KEY=VALUE[,KEY=VALUE]: e.g. last_call_timeout=5 (seconds an elastic "
        "rendezvous waits for more machines once MIN have joined; torch's default 30), join_timeout=600",
    ),
    Setting("max_restarts", int, 0, help="times the whole job restarts after a failure"),
    Setting(
        "keep_global_batch",
        bool,
        False,
        help="an elastic job keeps its global batch when machines are missing: gradient accumulation grows by "
        "(processes at MAX machines) / (processes now), which must divide",
    ),
    Setting(
        "auto_resume",
        bool,
        False,
        env.AUTO_RESUME,
        help="workers resume from the newest complete automatic checkpoint (Accelerator(resume='auto')); "
        "with --max-restarts a restarted job continues where its last checkpoint left it",
    ),
    Setting("monitor_interval", float, None, help="seconds between torchrun's checks of the workers"),
    Setting("log_dir", str, None, help="keep each worker's stdout/stderr in files under this folder (torchrun)"),
    Setting(
        "tee",
        str,
        None,
        help="streams also written to the log files: 1 stdout, 2 stderr, 3 both (default with --log-dir: 3)",
    ),
    Setting("use_cpu", bool, False, env.USE_CPU, help="run on the CPU even where an accelerator exists"),
    Setting("mixed_precision", str, "no", env.MIXED_PRECISION, tuple(PrecisionType.list()), "no, fp16, bf16, fp8"),
    Setting("gradient_accumulation_steps", int, 1, env.GRADIENT_ACCUMULATION_STEPS, help="micro-steps per step"),
    Setting(
        "dynamo_backend", str, "no", env.DYNAMO_BACKEND, tuple(DynamoBackend.list()), "torch.compile backend, or no"
    ),
    Setting(
        "debug",
        bool,
        False,
        env.DEBUG_MODE,
        help="torch's checks that every rank calls the same collective (TORCH_DISTRIBUTED_DEBUG=DETAIL)",
    ),
    Setting(
        "collective_timeout",
        float,
        None,
        env.COLLECTIVE_TIMEOUT,
        help="seconds a rank waits in a collective for the others before it fails (default 1800)",
    ),
    Setting(
        "stall_report_after",
        float,
        None,
        env.STALL_REPORT_AFTER,
        help="seconds a rank waits in one of accel's collectives before it prints which ranks have not reached "
        "it and where they are, once, without stopping the job (default 60; 0: off)",
    ),
    Setting("strategy", str, None, env.STRATEGY, help="an accel.strategies name (ddp, fsdp, ...); default: automatic"),
    Setting(
        "scheduler_stepping",
        str,
        None,
        env.SCHEDULER_STEPPING,
        tuple(SchedulerStepping.list()),
        "LR scheduler steps per optimizer step: per_process (as Accelerate, the default) or per_optimizer_step (one)",
    ),
    # The job's mesh (accel_core.parallel.config): unset sizes are 1, but the data-parallel one fills the rest.
    Setting("dp_replicate_size", int, None, "ACCEL_DP_REPLICATE_SIZE", help="model replicas (DDP; HSDP's replicas)"),
    Setting("dp_shard_size", int, None, "ACCEL_DP_SHARD_SIZE", help="FSDP2 shards of each replica"),
    Setting("tp_size", int, None, "ACCEL_TP_SIZE", help="tensor-parallel degree"),
    Setting("cp_size", int, None, "ACCEL_CP_SIZE", help="context-parallel degree (GPU)"),
    Setting("pp_size", int, None, "ACCEL_PP_SIZE", help="pipeline stages (torch.distributed.pipelining)"),
    Setting(
        "pp_schedule",
        str,
        None,
        "ACCEL_PP_SCHEDULE",
        ("gpipe", "1f1b", "interleaved_1f1b"),
        "pipeline schedule (default 1f1b)",
    ),
    Setting("pp_microbatches", int, None, "ACCEL_PP_MICROBATCHES", help="micro-batches per pipeline step"),
)
MESH_SETTINGS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "pp_size")
SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


def coerce(setting: Setting, value: Any, origin: str) -> Any:
    """Reads ``value`` (a typed flag, a YAML value or an environment string) as ``setting.kind``."""
    if value is None:
        return None
    result: Any
    if setting.kind is MachineRange:
        # Kept as a config file writes it: an integer, or "MIN:MAX" for an elastic job.
        try:
            machines = MachineRange.parse(value)
        except ValueError as error:
            raise ValueError(f"{origin}: {error}") from None
        result = str(machines) if machines.elastic else machines.maximum
    elif setting.kind is bool:
        try:
            result = env.parse_flag(value) if isinstance(value, str) else value
        except ValueError as error:
            raise ValueError(f"{origin}: {error}") from None
        if not isinstance(result, bool):
            raise ValueError(f"{origin}: expected true or false, got {value!r}.")
    elif setting.kind is str:
        # YAML 1.1 reads a bare `no` as False: the config then means the string "no".
        result = "no" if value is False else value
        if not isinstance(result, str) or not result:
            raise ValueError(f"{origin}: expected a word, got {value!r}.")
        if setting.choices is not None:
            result = result.lower()
    else:
        try:
            if isinstance(value, bool):
                raise ValueError
            result = setting.kind(value)
            if setting.kind is int and isinstance(value, float) and value != result:
                raise ValueError
        except (TypeError, ValueError):
            kind = "an integer" if setting.kind is int else "a number"
            raise ValueError(f"{origin}: expected {kind}, got {value!r}.") from None
    if setting.choices is not None and result not in setting.choices:
        raise ValueError(f"{origin}: {result!r} is not one of {', '.join(setting.choices)}.")
    return result


def origin(setting: Setting, source: str, config_file: str | None) -> str:
    """Where a value came from, as a user would write it: ``--flag``, the variable, the config key, the default."""
    if source == FLAG:
        return f"--{setting.name.replace('_', '-')}"
    if source == ENVIRONMENT:
        return f"environment variable {setting.env_var}"
    if source == CONFIG:
        return f"config file {config_file} key '{setting.name}'" if config_file else f"config key '{setting.name}'"
    return f"default of {setting.name}"
