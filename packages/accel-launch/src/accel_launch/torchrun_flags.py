"""torchrun's flags under ``accel launch``: the launch lines people type out of habit.

ML engineers have typed ``torchrun --nproc-per-node 8 train.py`` for years; ``accel launch`` takes those lines too.
Each of torchrun's flags that accel has not under the same name is here, with what ``accel launch`` does with it:

- setting: it is one of accel's launch settings under torchrun's name (``--node-rank`` is ``--machine-rank``,
  ``--master-addr`` ``--main-process-ip``, ``--rdzv-endpoint HOST:PORT`` both address and port), or, for
  ``--nproc-per-node``, counts them differently: torchrun counts one machine's processes, accel's ``-n`` all
  machines', so ``--nnodes 2 --nproc-per-node 4`` is ``-n 8`` (``plan.resolve_plan(processes_per_machine=)``);
- passed on: it tunes torchrun's agent, which accel runs (``--redirects``, ``--local-ranks-filter``, ...); it goes
  to torchrun's command line as given (it does nothing for one process, which runs without the agent);
- not needed: accel does the same without it (``--standalone``, ``--run-path``);
- refused: accel cannot do it (``--no-python``); the launch stops before starting anything, saying what to do.

The flags accel has under torchrun's own names (``-m``, ``-t``/``--tee``, ``--log-dir``, ``--max-restarts``,
``--monitor-interval``, ``--rdzv-backend``, ``--rdzv-conf``, ``--role``) are not in the table.

Pure and without torch: ``add_torchrun_flags`` adds the hidden flags to a parser, ``apply_torchrun_flags`` moves
the settings into the namespace and returns the rest.

Example::

    parser = argparse.ArgumentParser()
    add_torchrun_flags(parser)
    namespace = parser.parse_args(["--nproc-per-node", "4", "--master-port", "29501"])
    flags = apply_torchrun_flags(namespace)
    assert flags.processes_per_machine == 4 and namespace.main_process_port == 29501
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from .devices import detect_devices
from .hidden_flags import NOT_NEEDED, REFUSED, add_hidden_flag

_DEST_PREFIX = "torchrun_flag__"

SETTING = "setting"
PASSED_ON = "passed on"


class TorchrunFlagError(ValueError):
    """A torchrun flag asks for what ``accel launch`` cannot do, or contradicts another flag; the message says why."""


@dataclass(frozen=True)
class TorchrunFlag:
    """One of torchrun's flags that accel has not under the same name.

    names: torchrun's spellings (dashed first, then the underscored one and the short form, if any).
    outcome: ``SETTING``, ``PASSED_ON``, ``NOT_NEEDED`` or ``REFUSED``.
    why: for NOT_NEEDED and REFUSED, the sentence the user reads.
    takes_value: False for torchrun's switches.
    """

    names: tuple[str, ...]
    outcome: str
    why: str = ""
    takes_value: bool = True

    @property
    def flag(self) -> str:
        return self.names[0]

    @property
    def dest(self) -> str:
        return _DEST_PREFIX + self.flag.removeprefix("--").replace("-", "_")


def _spellings(flag: str, short: str | None = None) -> tuple[str, ...]:
    underscored = flag.replace("-", "_").replace("__", "--", 1)
    return tuple(name for name in (flag, underscored if underscored != flag else None, short) if name is not None)


def _setting(flag: str) -> TorchrunFlag:
    return TorchrunFlag(_spellings(flag), SETTING)


def _passed_on(flag: str, takes_value: bool = True, short: str | None = None) -> TorchrunFlag:
    return TorchrunFlag(_spellings(flag, short), PASSED_ON, takes_value=takes_value)


# torch 2.15's torchrun flags that accel launch has not under the same name (tests/cli checks the whole list).
TORCHRUN_FLAGS: tuple[TorchrunFlag, ...] = (
    _setting("--nproc-per-node"),
    _setting("--nnodes"),
    _setting("--node-rank"),
    _setting("--master-addr"),
    _setting("--master-port"),
    _setting("--rdzv-endpoint"),
    TorchrunFlag(
        ("--standalone",),
        NOT_NEEDED,
        "a one-machine job's rendezvous runs on this machine without it",
        takes_value=False,
    ),
    TorchrunFlag(
        _spellings("--run-path"), NOT_NEEDED, "accel runs the script with runpy.run_path anyway", takes_value=False
    ),
    TorchrunFlag(
        _spellings("--no-python"),
        REFUSED,
        "accel launch runs a Python script or module (-m); run another program with torchrun itself",
        takes_value=False,
    ),
    TorchrunFlag(
        _spellings("--print-completion"),
        REFUSED,
        "it prints torchrun's shell completion, which does not know accel launch; run torchrun --print-completion",
    ),
    _passed_on("--rdzv-id"),
    _passed_on("--start-method"),
    _passed_on("--redirects", short="-r"),
    _passed_on("--local-ranks-filter"),
    _passed_on("--log-line-prefix-template"),
    _passed_on("--local-addr"),
    _passed_on("--event-log-handler"),
    _passed_on("--duplicate-stdout-filters"),
    _passed_on("--duplicate-stderr-filters"),
    _passed_on("--logs-specs"),
    _passed_on("--numa-binding"),
    _passed_on("--signals-to-handle"),
    _passed_on("--shutdown-timeout"),
    _passed_on("--virtual-local-rank", takes_value=False),
)

# torchrun's default port of a rendezvous endpoint given without one.
ENDPOINT_DEFAULT_PORT = 29400


@dataclass
class TorchrunFlags:
    """What torchrun's flags asked for, beyond the settings they set in the namespace.

    processes_per_machine: ``--nproc-per-node`` as a number (``None``: not given).
    torchrun_options: the passed-on flags, as torchrun's ``--name=value`` words.
    notes: one line per flag that is not needed, or passed on but without effect here.
    """

    processes_per_machine: int | None = None
    torchrun_options: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def add_torchrun_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the spellings of ``TORCHRUN_FLAGS`` that ``parser`` does not have yet, hidden from ``--help``."""
    for entry in TORCHRUN_FLAGS:
        add_hidden_flag(parser, entry.names, entry.dest, entry.takes_value)


def apply_torchrun_flags(namespace: argparse.Namespace) -> TorchrunFlags:
    """Moves the torchrun flags given into accel's settings in ``namespace``; returns what remains of them.

    Raises ``TorchrunFlagError`` for a refused flag, and for a torchrun flag that says something else than the accel
    flag of the same setting given beside it (``--master-port 29501 --main-process-port 29502``)."""
    given = {entry.flag: getattr(namespace, entry.dest, None) for entry in TORCHRUN_FLAGS}
    result = TorchrunFlags()
    refused = [
        f"{entry.flag}: {entry.why}." for entry in TORCHRUN_FLAGS if entry.outcome == REFUSED and given[entry.flag]
    ]
    if refused:
        raise TorchrunFlagError("torchrun's flag(s) that accel launch cannot honour:\n  " + "\n  ".join(refused))

    def set_setting(flag: str, dest: str, value: Any) -> None:
        current = getattr(namespace, dest, None)
        if current is not None and str(current) != str(value):
            accel_flag = "--" + dest.replace("_", "-")
            raise TorchrunFlagError(
                f"{flag} {value} and {accel_flag} {current} say different things; give one of them."
            )
        setattr(namespace, dest, value)

    if given["--nnodes"] is not None:
        set_setting("--nnodes", "num_machines", given["--nnodes"])
    if given["--node-rank"] is not None:
        set_setting("--node-rank", "machine_rank", _integer("--node-rank", given["--node-rank"]))
    if given["--rdzv-endpoint"] is not None:
        host, port = _endpoint(given["--rdzv-endpoint"])
        set_setting("--rdzv-endpoint", "main_process_ip", host)
        set_setting("--rdzv-endpoint", "main_process_port", port)
    if given["--master-addr"] is not None:
        set_setting("--master-addr", "main_process_ip", given["--master-addr"])
    if given["--master-port"] is not None:
        set_setting("--master-port", "main_process_port", _integer("--master-port", given["--master-port"]))
    if given["--nproc-per-node"] is not None:
        if namespace.num_processes is not None:
            raise TorchrunFlagError(
                f"--nproc-per-node {given['--nproc-per-node']} and -n/--num-processes {namespace.num_processes} "
                "both count processes: give one (-n counts all machines' processes, --nproc-per-node one machine's)."
            )
        result.processes_per_machine = _processes_per_machine(given["--nproc-per-node"], namespace.use_cpu)
    if given["--standalone"] and namespace.num_machines not in (None, "1", "1:1", 1):
        raise TorchrunFlagError(
            f"--standalone is a job of one machine, but --nnodes/--num-machines says {namespace.num_machines}: "
            "drop one of them."
        )
    options: list[str] = []
    for entry in TORCHRUN_FLAGS:
        value = given[entry.flag]
        if value is None:
            continue
        if entry.outcome == NOT_NEEDED:
            result.notes.append(f"{entry.flag}: torchrun's flag, not needed: {entry.why}.")
        elif entry.outcome == PASSED_ON:
            options.append(entry.flag if not entry.takes_value else f"{entry.flag}={value}")
    result.torchrun_options = tuple(options)
    return result


def _integer(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise TorchrunFlagError(f"{flag} {value!r}: expected a whole number.") from None


def _endpoint(value: str) -> tuple[str, int]:
    """torchrun's ``HOST[:PORT]`` (``[::1]:29500`` for an IPv6 address); its default port when none is given."""
    text = value.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise TorchrunFlagError(f"--rdzv-endpoint {value!r}: expected HOST:PORT, e.g. 10.0.0.1:29400.")
    return host, _integer("--rdzv-endpoint", port_text) if port_text else ENDPOINT_DEFAULT_PORT


def _processes_per_machine(value: str, use_cpu: bool | None) -> int:
    """torchrun's ``--nproc-per-node``: a number, or ``gpu``/``xpu`` (the devices here), ``cpu`` (the cores) or
    ``auto`` (the devices here, else the cores), found as torchrun would but without importing torch."""
    text = value.strip().lower()
    if text not in ("auto", "gpu", "cuda", "xpu", "cpu"):
        count = _integer("--nproc-per-node", value)
        if count < 1:
            raise TorchrunFlagError(f"--nproc-per-node {value}: expected at least 1 process.")
        return count
    cores = os.cpu_count() or 1
    if text == "cpu":
        return cores
    devices = detect_devices()
    wanted = {"gpu": ("cuda",), "cuda": ("cuda",), "xpu": ("xpu",), "auto": ("cuda", "xpu")}[text]
    if devices.kind in wanted and not use_cpu:
        return devices.count
    if text == "auto":
        return cores
    raise TorchrunFlagError(
        f"--nproc-per-node {value}: no {text.upper()} device is visible here ({devices.kind}); give a number, or cpu."
    )
