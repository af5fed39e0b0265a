"""The launch config file: where it lives, reading it with checks, writing it. No torch.

The file is YAML with the keys of ``plan.SETTINGS`` at the top level, an optional ``env`` mapping
(extra variables for the workers) and one mapping per backend (``fsdp:``, ``deepspeed:``, ...)
whose options reach the workers as ``ACCEL_<BACKEND>_<OPTION>``::

    num_processes: 2
    use_cpu: true
    mixed_precision: bf16
    env:
      NCCL_DEBUG: WARN
    fsdp:
      sharding_strategy: FULL_SHARD

Location: ``--config-file`` > ``$ACCEL_CONFIG_FILE`` > ``$XDG_CONFIG_HOME/accel/default_config.yaml``
(``~/.config/accel/default_config.yaml`` when ``XDG_CONFIG_HOME`` is unset).
"""

from __future__ import annotations

import difflib
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel_core import environment as env

from .settings import SETTINGS, SETTINGS_BY_NAME, coerce

CONFIG_FILE_NAME = "default_config.yaml"
_HEADER = "# accel launch configuration: `accel config show` explains it, `accel config` rewrites it.\n"


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/accel/default_config.yaml``, or under ``~/.config`` when that is unset."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "accel" / CONFIG_FILE_NAME


def accelerate_default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``accelerate config`` writes its default file: ``$HF_HOME/accelerate/default_config.yaml`` (HF_HOME:
    ``$XDG_CACHE_HOME/huggingface``, ``~/.cache/huggingface``)."""
    environ = os.environ if environ is None else environ
    cache = environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    hf_home = environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    return Path(os.path.expanduser(hf_home)) / "accelerate" / CONFIG_FILE_NAME


def config_path(flag: str | None, environ: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config file to use and whether it was named explicitly (flag or ``ACCEL_CONFIG_FILE``)."""
    environ = os.environ if environ is None else environ
    if flag:
        return Path(flag).expanduser(), True
    named = environ.get(env.CONFIG_FILE)
    if named:
        return Path(named).expanduser(), True
    return default_config_path(environ), False


def validate_config(data: Any, origin: str) -> dict[str, Any]:
    """Checks a parsed config: known settings with valid values, ``env`` and backend sections as mappings.

    Returns the config with settings coerced to their types. Raises ``ValueError`` naming the key.
    """
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{origin}: the config must be a mapping of settings, got {type(data).__name__}.")
    result: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key in SETTINGS_BY_NAME:
            result[key] = coerce(SETTINGS_BY_NAME[key], value, f"{origin} key '{key}'")
        elif isinstance(value, Mapping) or value is None:
            # `env:` and backend sections: plain mappings of scalars (lists and dicts travel as JSON).
            result[key] = {str(k): v for k, v in (value or {}).items()}
        else:
            close = difflib.get_close_matches(key, [*SETTINGS_BY_NAME, "env"], n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(
                f"{origin}: unknown setting '{key}'.{hint} Known settings: {', '.join(SETTINGS_BY_NAME)}; "
                "a backend's options go in a section named after it (e.g. `fsdp:`). For an Accelerate file, "
                "run `accel config import <file>`."
            )
    return result


# A launch config is a few dozen lines: a bigger file is not one (a device, a log written to the wrong path), and
# reading it whole would take the memory before YAML could say so.
MAX_CONFIG_BYTES = 1024 * 1024
# Settings nest two levels (a backend section, maybe a list in it): far deeper is not a config, and the YAML composer
# recurses once per level (a RecursionError traceback past Python's limit).
MAX_CONFIG_DEPTH = 64


def read_yaml_file(path: str | os.PathLike[str], what: str, missing_hint: str) -> Any:
    """The parsed YAML of ``path``; ``ValueError`` naming ``what`` and the fix when it cannot be read.

    what: how messages name the file ("Config file", "Accelerate config file").
    missing_hint: the fix for a path that does not exist.

    Refused with one line naming the file: a directory, a special file (a FIFO would block the read forever, a
    device never end), a file over ``MAX_CONFIG_BYTES``, binary content, invalid YAML, nesting deeper than
    ``MAX_CONFIG_DEPTH`` and a key given twice in one mapping (YAML would keep the last one without a word).
    """
    path = Path(path)
    try:
        info = os.stat(path)  # follows a link: what would be read
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist: {missing_hint}") from None
    except OSError as error:
        raise ValueError(f"{what} {path} cannot be read ({error.strerror}): fix its permissions or the path.") from None
    if stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{what} {path} is a directory: pass the path of a YAML file, not its folder.")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(
            f"{what} {path} is not a regular file (a {_file_kind(info.st_mode)}): pass the path of a YAML file."
        )
    try:
        # O_NONBLOCK: a FIFO swapped in after the check must not block the open; a regular file ignores it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)  # bounded, whatever st_size said (/proc files say 0)
    except OSError as error:
        raise ValueError(f"{what} {path} cannot be read ({error.strerror}): fix its permissions or the path.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"{what} {path} is over {MAX_CONFIG_BYTES // 1024} kB, far more than a launch config holds: pass the "
            "YAML file `accel config` writes."
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"{what} {path} is not a text file (binary content): pass a YAML file, or rewrite it with `accel config`."
        ) from None
    if "\0" in text:
        raise ValueError(
            f"{what} {path} is not a text file (binary content): pass a YAML file, or rewrite it with `accel config`."
        )
    return _parse_yaml(text, what, path)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))
    kinds += ((stat.S_ISSOCK, "socket"),)
    return next((name for test, name in kinds if test(mode)), "special file")


def _parse_yaml(text: str, what: str, path: Path) -> Any:
    import yaml  # ~50 ms: only when a config file is actually read

    class StrictLoader(yaml.SafeLoader):
        """``yaml.SafeLoader`` refusing a key given twice in one mapping, and nesting past ``MAX_CONFIG_DEPTH``."""

        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > MAX_CONFIG_DEPTH:
                    mark = self.peek_event().start_mark
                    raise _ConfigShapeError(
                        f"line {mark.line + 1}: nested deeper than {MAX_CONFIG_DEPTH} levels, far more than a "
                        "launch config has"
                    )
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges an anchor: later keys override it, as YAML means them to
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader refuses it itself
                if first is not None:
                    where = f"line {line}" if first == line else f"lines {first} and {line}"
                    raise _ConfigShapeError(
                        f"key {key!r} is given twice ({where}); YAML would keep the last one silently. Keep one"
                    )
                seen[key] = line
            return super().construct_mapping(node, deep=deep)

    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: plain data only
    except _ConfigShapeError as error:
        raise ValueError(f"{what} {path}: {error}.") from None
    except yaml.YAMLError as error:
        raise ValueError(
            f"{what} {path} is not valid YAML: {error}\nFix the line shown, or rewrite it with `accel config`."
        ) from None


class _ConfigShapeError(Exception):
    """A config file YAML reads, but not as the writer meant it (a duplicate key, runaway nesting)."""


# Keys every file `accelerate config` writes, and no accel config has.
_ACCELERATE_MARKERS = ("compute_environment", "distributed_type")


def is_accelerate_config(data: Any) -> bool:
    """Whether parsed YAML is an Accelerate config file (it has ``compute_environment`` or ``distributed_type``)."""
    return isinstance(data, Mapping) and any(key in data for key in _ACCELERATE_MARKERS)


def read_config(path: str | os.PathLike[str], announce: bool = True) -> dict[str, Any]:
    """Reads and checks the YAML config at ``path`` (``config_from_data``)."""
    data = read_yaml_file(path, "Config file", "create it with `accel config` or fix the path.")
    return config_from_data(data, path, announce)


def config_from_data(data: Any, path: str | os.PathLike[str], announce: bool = True) -> dict[str, Any]:
    """Checks the parsed YAML of the config file at ``path``. An Accelerate config file (``accelerate launch
    --config_file`` out of habit) is read as ``accel config import`` converts it, saying so (``announce``: the caller
    has not said it already) and what it drops on stderr."""
    if is_accelerate_config(data):
        from .accelerate_import import convert_accelerate_config

        data, warnings = convert_accelerate_config(data)
        if announce:
            print(
                f"accel: {path} is an Accelerate config file: read as `accel config import {path}` converts it "
                "(that command writes the converted file).",
                file=sys.stderr,
            )
        for warning in warnings:
            print(f"accel: warning: {warning}", file=sys.stderr)
    return validate_config(data, f"config file {path}")


def load_config(
    flag: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], Path | None]:
    """The config to launch with and its path; ``({}, None)`` when there is no default file.

    A file named explicitly (flag or ``ACCEL_CONFIG_FILE``) must exist. Without one and without accel's default file,
    Accelerate's default file (``accelerate config``'s) is read if it exists, converted and said so: an Accelerate
    user's settings (8 processes, FSDP) would otherwise not apply to ``accel launch train.py``, without a word.
    """
    path, explicit = config_path(flag, environ)
    # A default path holding something that is not a file (a folder, a FIFO) is refused by read_config, not skipped.
    if not explicit and not path.exists():
        accelerate_path = accelerate_default_config_path(environ)
        if not accelerate_path.is_file():
            return {}, None
        print(
            f"accel: no accel config file ({path}); reading Accelerate's default config {accelerate_path} as "
            f"`accel config import` converts it (`accel config import {accelerate_path}` writes it as accel's).",
            file=sys.stderr,
        )
        return read_config(accelerate_path, announce=False), accelerate_path
    return read_config(path), path


def dump_config(config: Mapping[str, Any]) -> str:
    """The YAML text of ``config``: settings in their usual order, then ``env``, then backend sections."""
    import yaml

    ordered = {s.name: config[s.name] for s in SETTINGS if s.name in config}
    ordered.update({k: dict(v) for k, v in config.items() if k not in ordered and isinstance(v, Mapping)})
    return yaml.safe_dump(ordered, sort_keys=False, default_flow_style=False)


def write_config(path: str | os.PathLike[str], config: Mapping[str, Any]) -> Path:
    """Checks ``config`` and writes it to ``path`` (creating folders); returns the path."""
    path = Path(path)
    checked = validate_config(dict(config), f"config for {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(_HEADER + dump_config(checked))
    os.replace(tmp, path)  # a reader never sees half a file
    return path
