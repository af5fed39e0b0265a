"""Loading the backends' ``accel launch`` flags: the ``accel.cli`` entry points, their argument groups and the
variables their flags set. No torch.

The contract a backend implements (``LaunchExtension``, ``OptionTable`` and the value parsers) is accel-core's
``accel_core.launch_options``, so a backend needs only accel-core; this module is the launcher's side of it.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from accel_core.environment import MESH_OVER_DEVICES
from accel_core.launch_options import (
    GROUP,
    LaunchExtension,
    LaysMeshOverDevices,
    as_extension,
    declared_options,
)


def mesh_over_devices_env(extensions: Iterable[LaunchExtension], strategy: str | None) -> dict[str, str]:
    """``{"ACCEL_MESH_OVER_DEVICES": "true"}`` when ``strategy`` is an extension's that lays the mesh over devices."""
    over_devices = any(
        extension.name == strategy and isinstance(extension, LaysMeshOverDevices) and extension.lays_mesh_over_devices()
        for extension in extensions
    )
    return {MESH_OVER_DEVICES: "true"} if over_devices else {}


def load_extensions(names: Iterable[str] | None = None) -> list[LaunchExtension]:
    """The installed ``accel.cli`` extensions, in name order.

    A broken extension is reported on stderr and skipped: one backend must not break the command line.
    """
    from accel_core import discovery  # importlib.metadata: only for the commands that take backend flags

    extensions: list[LaunchExtension] = []
    for name in discovery.available(GROUP) if names is None else names:
        try:
            obj = as_extension(discovery.load(GROUP, name))
            if not isinstance(obj, LaunchExtension):
                raise TypeError("it needs `name`, `add_arguments(group)` and `to_env(namespace)`")
        except Exception as error:  # noqa: BLE001 - any failure of third-party code is reported, not fatal
            print(f"accel: ignoring the {GROUP} entry point '{name}': {error}", file=sys.stderr)
            continue
        extensions.append(obj)
    return extensions


def add_extension_arguments(parser: argparse.ArgumentParser, extensions: Iterable[LaunchExtension]) -> None:
    """Adds one argument group per extension, titled with its name."""
    for extension in extensions:
        group = parser.add_argument_group(f"{extension.name} options")
        try:
            extension.add_arguments(group)
        except argparse.ArgumentError as error:
            print(f"accel: ignoring the flags of '{extension.name}': {error}", file=sys.stderr)


def extension_env(extensions: Iterable[LaunchExtension], namespace: argparse.Namespace) -> dict[str, str]:
    """The variables every extension derives from the parsed flags, checked to be strings."""
    result: dict[str, str] = {}
    for extension in extensions:
        produced = extension.to_env(namespace) or {}
        for key, value in produced.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(
                    f"The {GROUP} extension '{extension.name}' returned {key!r}: {value!r} from to_env; "
                    "variables and values must be strings."
                )
        result.update(produced)
    return result


# Config sections that are not a backend's: the workers' extra environment.
ENV_SECTION = "env"


def check_config_sections(
    config: Mapping[str, Any], extensions: Iterable[LaunchExtension], config_file: str | None
) -> None:
    """Refuses, before anything starts, a backend section or section option that no strategy would read.

    Each section other than ``env`` becomes ``ACCEL_<SECTION>_<OPTION>`` variables; a misspelt one would reach the
    workers as a variable nobody reads and the setting would silently not apply. A section named almost like a
    backend (``fsdpp:``) is refused with the name it resembles; any other name passes (a third-party backend's, or
    variables the user's own script reads: ``mytool: {level: 7}`` is ``ACCEL_MYTOOL_LEVEL``). An installed backend
    that declares its options (``DeclaresConfigOptions``) must know every option of its section.
    Raises ``ValueError`` naming the file, the section, the option, the closest known name and the known ones.
    """
    from accel_core import discovery  # entry-point metadata: only when a config file has sections

    sections = [name for name, options in config.items() if isinstance(options, Mapping) and name != ENV_SECTION]
    if not sections:
        return
    where = config_file or "the config file"
    extensions = list(extensions)
    declared = declared_config_options(extensions)
    backends = {
        *(extension.name for extension in extensions),
        *discovery.available("accel.strategies"),
        *discovery.known("accel.strategies"),
        *discovery.known("accel.precisions"),
    }
    for section in sections:
        if section not in backends:
            close = difflib.get_close_matches(section, [*backends, ENV_SECTION], n=1, cutoff=0.75)
            if close:
                raise ValueError(
                    f"{where}: section '{section}:' is named almost like '{close[0]}:', which it is taken to mean; "
                    f"write '{close[0]}:' (a section of another name passes to the workers as "
                    f"ACCEL_{section.upper()}_<OPTION> variables, which no backend reads)."
                )
            continue
        if section not in declared:
            continue
        known = sorted(declared[section])
        unknown = [str(option) for option in config[section] if str(option).lower().replace("-", "_") not in known]
        if unknown:
            raise ValueError(
                f"{where}: the '{section}:' section has option(s) the {section} strategy does not read: "
                f"{', '.join(unknown)}{_did_you_mean(unknown[0], known)}. Known: {', '.join(known)}."
            )


def declared_config_options(extensions: Iterable[LaunchExtension]) -> dict[str, frozenset[str]]:
    """Section name -> the options it may hold, for the extensions that declare them (``DeclaresConfigOptions``)."""
    declared = {extension.name: declared_options(extension) for extension in extensions}
    return {name: options for name, options in declared.items() if options is not None}


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
