"""The contract a backend uses to add its flags to ``accel launch``: the ``accel.cli`` entry-point group. No torch.

A backend package registers one object (or a class/factory that takes no argument and returns
one) under ``accel.cli``::

    [project.entry-points."accel.cli"]
    fsdp = "accel_fsdp.cli:FSDPLaunchOptions"

The object answers ``LaunchExtension``: ``name``, ``add_arguments(group)`` and ``to_env(namespace)``;
``OptionTable`` builds one from a table of flags, with the value parsers below. The module it lives in
must not import torch or the backend's heavy library: ``accel launch --help`` loads it.

The contract lives here, in accel-core, so that a backend depends on accel-core alone; the launcher
(accel-launch, ``accel_launch.extensions``) loads the entry points and turns the flags into the
workers' environment.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from typing import Any, Protocol, runtime_checkable

GROUP = "accel.cli"


@runtime_checkable
class LaunchExtension(Protocol):
    """What a backend contributes to ``accel launch``.

    ``name`` is the backend's name: the title of its flag group in ``--help``, its config-file
    section (``fsdp:``), and the prefix of its variables (``ACCEL_FSDP_*``).

    Example::

        class FSDPLaunchOptions:
            name = "fsdp"

            def add_arguments(self, group):
                # dests prefixed with the backend's name, defaults None ("not given")
                group.add_argument("--fsdp-sharding-strategy", dest="fsdp_sharding_strategy", default=None)

            def to_env(self, namespace):
                # only what was given; ACCEL_STRATEGY too if a flag implies the backend
                value = namespace.fsdp_sharding_strategy
                return {} if value is None else {"ACCEL_FSDP_SHARDING_STRATEGY": value}
    """

    name: str

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        """Adds the backend's flags; each defaults to ``None`` so an absent flag overrides nothing."""

    def to_env(self, namespace: argparse.Namespace) -> dict[str, str]:
        """The variables the given flags set for the workers (they win over environment and config)."""
        ...


@runtime_checkable
class LaysMeshOverDevices(Protocol):
    """Optional capability of a ``LaunchExtension``: its strategy lays the mesh over the devices each process
    drives (XLA's SPMD: one process, every device), so ``--dp-shard-size`` / ``--tp-size`` count devices and
    the launcher must not check them against ``--num-processes`` (the strategy checks them in the process).

    Read for the strategy the workers will run, however it was chosen: a flag, the environment or the
    config file's ``strategy:``.
    """

    def lays_mesh_over_devices(self) -> bool:
        """True: the launcher leaves the mesh sizes to the strategy (``ACCEL_MESH_OVER_DEVICES``)."""
        ...


@runtime_checkable
class DeclaresConfigOptions(Protocol):
    """Optional capability of a ``LaunchExtension``: the options its config-file section may hold, so that the
    launcher refuses one its strategy would not read (``fsdp: {sharding_stratgy: ...}``) before any worker starts,
    instead of passing it on as an ``ACCEL_FSDP_SHARDING_STRATGY`` that nobody reads.

    Must not import torch (``accel launch`` asks it before starting anything).
    """

    def config_options(self) -> Collection[str]:
        """Every option (lower-case) the strategy reads from its ``ACCEL_<NAME>_<OPTION>`` variables."""
        ...


def as_extension(registered: Any) -> Any:
    """What an ``accel.cli`` entry point registered, as the extension object: a class, or a factory that takes no
    argument, is called; an object answering ``LaunchExtension`` is used as it is."""
    if isinstance(registered, type) or (not isinstance(registered, LaunchExtension) and callable(registered)):
        return registered()
    return registered


def declared_options(extension: Any) -> frozenset[str] | None:
    """The config-section options ``extension`` declares (``DeclaresConfigOptions``); ``None`` when it declares none."""
    return frozenset(extension.config_options()) if isinstance(extension, DeclaresConfigOptions) else None


@runtime_checkable
class ChecksBeforeLaunch(Protocol):
    """Optional capability of a ``LaunchExtension``: checks the installation its strategy needs before any worker
    starts (torch-xla built for another torch, say), so a job that cannot run ends in the launcher with the fix
    instead of in every worker.

    Called for the strategy the workers will run, however it was chosen: a flag, the environment or the config
    file's ``strategy:``. Must not import torch or the backend's heavy library (package metadata is fine).
    """

    def check_before_launch(self) -> None:
        """Raises ``ImportError`` or ``ValueError`` naming what to install or change."""
        ...


# -- a table-driven LaunchExtension -----------------------------------------------------------------
# Value parsers for backend flags: each checks the text and returns what travels in the environment.
_TRUE, _FALSE = {"1", "true", "yes", "on", "y", "t"}, {"0", "false", "no", "off", "n", "f"}


def bool_text(value: str) -> str:
    """``true`` / ``false`` from any usual spelling."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return "true"
    if lowered in _FALSE:
        return "false"
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def nonnegative_int_text(value: str) -> str:
    """A whole number >= 0 (``1e6`` accepted)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if not number.is_integer() or number < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value!r}")
    return str(int(number))


def nonnegative_number_text(value: str) -> str:
    """A number >= 0, kept as written."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return value.strip()


def choice_text(choices: tuple[str, ...]) -> Any:
    """One of ``choices`` (case-insensitive), or its 1-based position in the list, as Accelerate allows."""

    def parse(value: str) -> str:
        name = value.strip().upper()
        if name.isdigit() and 1 <= int(name) <= len(choices):
            return choices[int(name) - 1]
        if name not in choices:
            raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(choices)}")
        return name

    return parse


class OptionTable:
    """A ``LaunchExtension`` described by a table; a backend subclasses it and fills two attributes.

    name: the backend (flag group, config section, ``ACCEL_<NAME>_*`` prefix, ``--use-<name>``).
    options: ``(flag, OPTION, parse, metavar, help)`` rows; ``--<flag>`` sets ``ACCEL_<NAME>_<OPTION>``
        (Accelerate's ``--<flag_with_underscores>`` spelling is accepted too, hidden from help).
    accelerate_name: Accelerate's name for the backend where it differs (``megatron_lm``): its ``--use_<name>`` and
        ``--<name>_<option>`` flags are accepted too, hidden, so that Accelerate's launch lines run unchanged.
    Any option given also selects the backend (``ACCEL_STRATEGY``): it only makes sense with it.

    Example::

        class ToyLaunchOptions(OptionTable):
            name = "toy"
            options = (("toy-level", "LEVEL", nonnegative_int_text, "N", "how much toy"),)
    """

    name: str = ""
    options: tuple[tuple[str, str, Any, str, str], ...] = ()
    accelerate_name: str = ""

    def _dest(self, option: str) -> str:
        return f"{self.name}_{option.lower()}"

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        use = f"use_{self.name}"
        group.add_argument(
            f"--use-{self.name}",
            dest=use,
            action="store_true",
            default=None,
            help=f"train with the {self.name} strategy",
        )
        hidden = [f"--use_{self.name}"] + ([f"--use_{self.accelerate_name}"] if self.accelerate_name else [])
        group.add_argument(*hidden, dest=use, action="store_true", default=None, help=argparse.SUPPRESS)
        for flag, option, parse, metavar, text in self.options:
            group.add_argument(
                f"--{flag}", dest=self._dest(option), type=parse, default=None, metavar=metavar, help=text
            )
            aliases = ["--" + flag.replace("-", "_")] if "-" in flag else []
            if self.accelerate_name:
                aliases.append(f"--{self.accelerate_name}_{option.lower()}")
            if aliases:
                group.add_argument(*aliases, dest=self._dest(option), type=parse, default=None, help=argparse.SUPPRESS)

    def to_env(self, namespace: argparse.Namespace) -> dict[str, str]:
        prefix = f"ACCEL_{self.name.upper()}_"
        result = {
            prefix + option: str(value)
            for _, option, _, _, _ in self.options
            if (value := getattr(namespace, self._dest(option), None)) is not None
        }
        if getattr(namespace, f"use_{self.name}", None) or result:
            result["ACCEL_STRATEGY"] = self.name
        return result
