"""``accel config`` (questions), ``accel config default``, ``accel config show``, ``accel config import <file>``,
``accel config update``."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accel_core.enums import DynamoBackend
from accel_launch.config import (
    accelerate_default_config_path,
    config_from_data,
    config_path,
    dump_config,
    is_accelerate_config,
    read_config,
    read_yaml_file,
    validate_config,
)
from accel_launch.plan import resolve_plan
from accel_launch.settings import SETTINGS, MachineRange

from .common import format_env, format_settings, write_config_file
from .questions import Asker

DESCRIPTION = """Writes, shows or imports the launch config file that `accel launch` reads.

  accel config                 answer a few questions (Enter keeps the [default])
  accel config default         write a config for this machine without questions
  accel config show            print the file and the settings a launch would use
  accel config import FILE     convert an Accelerate default_config.yaml
  accel config update          rewrite the existing file in the current format (an Accelerate file converted,
                               values in their types, settings in order); asks nothing"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel config", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=["ask", "default", "show", "import", "update"],
        default="ask",
        help=argparse.SUPPRESS,
    )
    parser.add_argument("source", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument(
        "--config-file",
        "--config_file",
        dest="config_file",
        metavar="PATH",
        help="the file to write or show (default: $ACCEL_CONFIG_FILE, else ~/.config/accel/...)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing file (default, import)")
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    path, explicit = config_path(args.config_file)
    if args.action == "import" and not args.source:
        parser.error(
            "accel config import needs the Accelerate file, e.g. ~/.cache/huggingface/accelerate/default_config.yaml"
        )
    if args.action != "import" and args.source:
        parser.error(f"unexpected argument {args.source!r}")
    if path.is_dir():
        raise ValueError(f"Config file {path} is a directory: pass --config-file with the path of a YAML file.")
    if path.exists() and not path.is_file():  # a FIFO, a device: refused as `accel launch` refuses it
        read_yaml_file(path, "Config file", "fix the path.")
    if args.action == "show":
        return show(path, explicit)
    if args.action == "update":
        return update(path)
    # The source first: a missing or broken one is the problem to report, whatever the destination.
    imported = import_accelerate(Path(args.source).expanduser()) if args.action == "import" else None
    if args.action in ("default", "import") and path.exists() and not args.force:
        raise ValueError(f"{path} exists: pass --force to overwrite it, or --config-file <other path>.")
    if args.action == "default":
        config = default_config()
    elif imported is not None:
        config = imported
    else:
        config = ask_config(read_config(path) if path.exists() else None)
    # Refuse to write what `accel launch` would refuse to run.
    resolve_plan({}, {}, validate_config(config, "the new config"), config_file=str(path))
    write_config_file(path, config)
    print(f"Wrote {path}. `accel config show` shows it; `accel test` checks it.")
    return 0


def show(path: Path, explicit: bool = True) -> int:
    """Prints the file and the settings a launch would resolve from it and the environment (no torch).

    A file `accel launch` would refuse (an unknown key, a bad value) is shown all the same, each
    problem as a warning; the settings below leave the refused keys out. An Accelerate config file is shown
    converted, as `accel launch` reads it; so is Accelerate's default one when accel's default is missing
    (``explicit``: the path was named, by flag or ``ACCEL_CONFIG_FILE``, and nothing else is read).
    """
    if not explicit and not path.is_file() and accelerate_default_config_path().is_file():
        print(f"config file: {path} (does not exist: `accel launch` reads Accelerate's default config instead)")
        path = accelerate_default_config_path()
    if not path.is_file():
        config: dict[str, Any] = {}
        print(f"config file: {path} (does not exist: `accel config` or `accel config default` writes it)")
    elif is_accelerate_config(data := read_yaml_file(path, "Config file", "fix the path.")):
        config = config_from_data(data, path, announce=False)  # as `accel launch` reads it (drops: on stderr)
        print(f"config file: {path} (an Accelerate config file, read as `accel config import` converts it)\n")
        print(dump_config(config).rstrip())
    else:
        config, problems = _readable_part(data, f"config file {path}")
        print(f"config file: {path}\n")
        print(path.read_text(encoding="utf-8").rstrip() if problems else dump_config(config).rstrip())
        for problem in problems:
            print(f"\nwarning: {problem}\n(`accel launch` refuses this file until it is fixed.)")
    plan = resolve_plan({}, os.environ, config, config_file=str(path))
    print(f"\nsettings of `accel launch` without flags (environment > config file > default):\n{format_settings(plan)}")
    print(f"added to the workers' environment:\n{format_env(plan.env)}")
    return 0


def update(path: Path) -> int:
    """Rewrites the config file at ``path`` in the current format, as ``accelerate config update`` does for
    Accelerate's: an Accelerate file converted (what does not map is said on stderr), each value in its setting's
    type, the settings in their usual order. A file already current keeps its content (and says so); one that
    ``accel launch`` would refuse is refused with the key to fix, and not written."""
    if not path.is_file():
        raise ValueError(f"no config file at {path} to update: `accel config` (or `accel config default`) writes one.")
    data = read_yaml_file(path, "Config file", "fix the path.")
    was_accelerate = is_accelerate_config(data)
    config = config_from_data(data, path, announce=False)
    resolve_plan({}, {}, config, config_file=str(path))  # what `accel launch` would refuse, refused here too
    old_text = path.read_text(encoding="utf-8")
    write_config_file(path, config)
    if path.read_text(encoding="utf-8") == old_text:
        print(f"{path} is already in the current format: nothing changed.")
        return 0
    how = "converted from Accelerate's format" if was_accelerate else "rewritten in the current format"
    print(f"Updated {path}: {how}. `accel config show` shows it.")
    return 0


def _readable_part(data: Any, origin: str) -> tuple[dict[str, Any], list[str]]:
    """The keys of a parsed config file that pass ``validate_config`` one by one (a backend section: and
    ``check_config_sections``, as ``accel launch`` checks it), and the errors of the others."""
    from accel_launch.extensions import check_config_sections, load_extensions

    if not isinstance(data, dict):
        return validate_config(data, origin), []  # not a mapping: nothing to show key by key (raises)
    extensions = load_extensions()
    config: dict[str, Any] = {}
    problems = []
    for key, value in data.items():
        try:
            entry = validate_config({key: value}, origin)
            check_config_sections(entry, extensions, origin)
            config.update(entry)
        except ValueError as error:
            problems.append(str(error))
    return config, problems


def default_config() -> dict[str, Any]:
    """A config for this machine: one process per GPU (XPU), else one process; the CPU when nothing else."""
    from accel_launch.devices import detect_devices

    devices = detect_devices()
    many = devices.kind in ("cuda", "xpu")
    config = {s.name: s.default for s in SETTINGS if s.default is not None}
    config.update(num_processes=devices.count if many else 1, use_cpu=not devices.has_accelerator)
    return config


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None) -> Path | bool:
    """Writes ``default_config()`` for this machine with ``mixed_precision``, as ``accel config default`` does.

    The reference's ``accelerate.utils.write_basic_config``. save_location: the file (default: the
    one ``accel launch`` reads, see ``accel config show``). An existing file is left alone: prints
    so and returns False; otherwise returns the path written.

    Example::

        from accel.utils import write_basic_config
        write_basic_config(mixed_precision="bf16")
    """
    path = Path(save_location).expanduser() if save_location is not None else config_path(None)[0]
    if path.exists():
        print(
            f"Configuration already exists at {path}, will not override. Run `accel config` manually or pass a "
            "different `save_location`."
        )
        return False
    precision = str(mixed_precision).lower()
    if precision not in ("no", "fp16", "bf16", "fp8"):
        raise ValueError(
            f"`mixed_precision` should be one of 'no', 'fp16', 'bf16', or 'fp8'. Received {mixed_precision}"
        )
    config = {**default_config(), "mixed_precision": precision}
    resolve_plan({}, {}, validate_config(config, "the new config"), config_file=str(path))
    return write_config_file(path, config)


def _launch_config_path() -> Path:
    """The file a plain ``accel launch`` reads: accel's (named by ``ACCEL_CONFIG_FILE``, or the default one when it
    exists), else Accelerate's default file when that exists, else accel's default path."""
    path, explicit = config_path(None)
    if not explicit and not path.is_file() and accelerate_default_config_path().is_file():
        return accelerate_default_config_path()
    return path


# Accelerate's `accelerate.commands.config.default_config_file`: the file a launch without --config_file reads.
default_config_file = str(_launch_config_path())


@dataclass(frozen=True)
class LaunchConfigFile:
    """A config file as ``accel launch`` reads it (an Accelerate file converted): ``to_dict()`` gives its settings."""

    path: Path
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The settings, ``{"num_processes": 2, "mixed_precision": "bf16", ...}`` (a copy)."""
        return dict(self.settings)


def load_config_from_file(config_file: str | os.PathLike[str] | None = None) -> LaunchConfigFile:
    """Reads ``config_file`` (default: ``default_config_file``) as ``accel launch`` does; FileNotFoundError when it does
    not exist. Accelerate's ``load_config_from_file`` (its object's ``to_dict()`` gives the settings here too).

    Example::

        from accel.commands.config import default_config_file, load_config_from_file
        if os.path.isfile(default_config_file):
            print(load_config_from_file(None).to_dict())
    """
    path = Path(config_file if config_file is not None else default_config_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"The configuration file `{path}` does not exist: pass an existing file, or write one with `accel config` "
            "(`accel config show` prints where `accel launch` looks)."
        )
    return LaunchConfigFile(path, read_config(path, announce=False))


def import_accelerate(source: Path) -> dict[str, Any]:
    """The accel config converted from an Accelerate ``default_config.yaml`` (warns about what does not map)."""
    from accel_launch.accelerate_import import convert_accelerate_config

    data = read_yaml_file(
        source,
        "Accelerate config file",
        "pass the file `accelerate config` wrote (by default ~/.cache/huggingface/accelerate/default_config.yaml).",
    )
    if data is not None and not isinstance(data, dict):
        raise ValueError(
            f"Accelerate config file {source} holds a YAML {type(data).__name__}, not the mapping of settings "
            "`accelerate config` writes: pass that file."
        )
    config, warnings = convert_accelerate_config(data or {})
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return config


def ask_config(existing: dict[str, Any] | None, asker: Asker | None = None) -> dict[str, Any]:
    """Asks for each setting; defaults come from ``existing`` (the current file) or this machine."""
    asker = asker or Asker()
    print("accel config: answer each question, or press Enter to keep the [default].")
    base = existing if existing is not None else default_config()
    config: dict[str, Any] = {k: v for k, v in base.items() if isinstance(v, dict)}  # keep env and backend sections

    def current(name: str) -> Any:
        return base.get(name, next(s.default for s in SETTINGS if s.name == name))

    known_machines = MachineRange.parse(current("num_machines")).maximum  # an elastic MIN:MAX asks for MAX
    config["num_machines"] = machines = asker.integer("How many machines?", known_machines, minimum=1)
    if machines > 1:
        config["machine_rank"] = asker.integer("Rank of this machine (0 for the main one)?", current("machine_rank"))
        config["main_process_ip"] = asker.text("Address of the main machine?", current("main_process_ip"))
        config["main_process_port"] = asker.integer(
            "Port on the main machine?", current("main_process_port") or 29500, 1
        )
        config["rdzv_backend"] = asker.choice(
            "Rendezvous backend?", current("rdzv_backend"), ["static", "c10d", "etcd"]
        )
    config["use_cpu"] = asker.yes_no("Run on the CPU only?", current("use_cpu"))
    per_machine = max(1, current("num_processes") // known_machines)
    config["num_processes"] = asker.integer(
        "How many processes in total, over all machines?", per_machine * machines, 1
    )
    from accel_core import discovery  # entry-point scan: only when asking

    strategies = discovery.available("accel.strategies")
    config["strategy"] = _none_if_auto(asker.choice("Strategy?", current("strategy") or "auto", ["auto", *strategies]))
    if config["strategy"]:
        section = ask_backend_options(asker, config["strategy"], base.get(config["strategy"]))
        if section:
            config[config["strategy"]] = section
    config["mixed_precision"] = asker.choice(
        "Mixed precision?", current("mixed_precision"), ["no", "fp16", "bf16", "fp8"]
    )
    config["gradient_accumulation_steps"] = asker.integer(
        "Gradient accumulation steps?", current("gradient_accumulation_steps"), minimum=1
    )
    config["dynamo_backend"] = asker.choice("torch.compile backend?", current("dynamo_backend"), DynamoBackend.list())
    config["debug"] = asker.yes_no(
        "Debug mode (torch checks that every rank calls the same collective)?", current("debug")
    )
    for name in ("max_restarts", "monitor_interval", "log_dir", "tee", "scheduler_stepping"):
        if base.get(name) is not None:
            config[name] = base[name]
    return {k: v for k, v in config.items() if v is not None}


def ask_backend_options(asker: Asker, backend: str, existing: dict[str, Any] | None) -> dict[str, Any] | None:
    """The backend's section of the config file, asked option by option from its ``accel launch``
    flag table (``OptionTable.options``); Enter keeps the current value, or the backend's default."""
    from accel_launch.extensions import load_extensions

    table = next(iter(load_extensions([backend])), None)
    options = getattr(table, "options", ())
    if not options or not asker.yes_no(f"Set {backend} options now (otherwise its defaults apply)?", False):
        return existing
    section = dict(existing or {})
    for flag, option, parse, _metavar, text in options:
        key = option.lower()
        current = section.get(key)
        shown = None if current is None else str(current).lower() if isinstance(current, bool) else str(current)
        answer = asker.ask(f"  {flag}", shown, _as_value_error(parse), hint=text, required=False)
        if answer is not None:
            section[key] = _yaml_value(answer)
    return section


def _as_value_error(parse: Any) -> Any:
    """The flag parsers raise argparse.ArgumentTypeError; the questions re-ask on ValueError."""

    def checked(text: str) -> Any:
        try:
            return parse(text)
        except argparse.ArgumentTypeError as error:
            raise ValueError(str(error)) from None

    return checked


def _yaml_value(text: Any) -> Any:
    """``true`` / ``false`` / whole numbers as YAML booleans and ints, the rest as written."""
    if not isinstance(text, str):
        return text
    if text in ("true", "false"):
        return text == "true"
    return int(text) if text.isdigit() else text


def _none_if_auto(value: str) -> str | None:
    return None if value == "auto" else value
