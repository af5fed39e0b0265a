"""Loading the backends' ``accel launch`` flags: the ``accel.cli`` entry points, their argument groups and the
variables their flags set. No torch.

The contract a backend implements (``LaunchExtension``, ``OptionTable`` and the value parsers) is accel-core's
``accel_core.launch_options``, so a backend needs only accel-core; this module is the launcher's side of it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from accel_core.environment import MESH_OVER_DEVICES
from accel_core.launch_options import GROUP, LaunchExtension, LaysMeshOverDevices


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
            obj: Any = discovery.load(GROUP, name)
            if isinstance(obj, type) or (not isinstance(obj, LaunchExtension) and callable(obj)):
                obj = obj()  # a class or a factory: build the object
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
