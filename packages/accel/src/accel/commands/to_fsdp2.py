"""``accel to-fsdp2``: rewrites the fsdp section of a config file from FSDP1 to FSDP2 settings. No torch.

Works on accel's config file (an ``fsdp:`` section, keys as the ``--fsdp-*`` flags without their
prefix) and on Accelerate's (``fsdp_config:`` with ``fsdp_``-prefixed keys), writing the same kind.
What it changes, as Accelerate's ``accelerate to-fsdp2`` does:

- ``version`` (``fsdp_version``) 1 becomes 2;
- ``sharding_strategy`` becomes ``reshard_after_forward`` (FULL_SHARD: true, SHARD_GRAD_OP: false);
  the hybrid strategies are kept besides, since accel's FSDP2 builds its HSDP mesh from them;
- FSDP1-only keys (backward/forward prefetch, use_orig_params, limit_all_gathers) are dropped,
  each with a note: FSDP2 always prefetches the next unit and keeps the original parameters.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accel_launch.config import config_path, read_yaml_file, validate_config

from .common import write_config_file

DESCRIPTION = """Converts the FSDP1 settings of a config file to FSDP2 (accel's fsdp section, or an
Accelerate default_config.yaml's fsdp_config), saying what it drops. The input is left as it is
unless --overwrite is given without --output-file."""

# sharding_strategy -> reshard_after_forward (FULL_SHARD frees gathered parameters after forward, ZeRO-2 keeps them).
RESHARD_AFTER_FORWARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "_HYBRID_SHARD_ZERO2": False,
    "HYBRID_SHARD_ZERO2": False,
}
HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "HYBRID_SHARD_ZERO2")
FSDP1_ONLY = {
    "backward_prefetch": "FSDP2 prefetches the next unit itself",
    "backward_prefetch_policy": "FSDP2 prefetches the next unit itself",
    "forward_prefetch": "FSDP2 prefetches the next unit itself",
    "use_orig_params": "FSDP2 always keeps the original parameters",
    "limit_all_gathers": "FSDP2 has no all-gather rate limit",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accel to-fsdp2", description=DESCRIPTION)
    parser.add_argument(
        "--config-file",
        "--config_file",
        dest="config_file",
        metavar="PATH",
        help="the FSDP1 config (default: $ACCEL_CONFIG_FILE, else ~/.config/accel/default_config.yaml)",
    )
    parser.add_argument(
        "--output-file", "--output_file", dest="output_file", metavar="PATH", help="where to write the FSDP2 config"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output file; without --output-file, rewrite the config file itself",
    )
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    source, _ = config_path(args.config_file)
    if args.output_file is None and not args.overwrite:
        parser.error("say where to write the result: --output-file PATH, or --overwrite to rewrite the config file")
    target = Path(args.output_file).expanduser() if args.output_file else source
    if target != source and target.exists() and not args.overwrite:
        raise ValueError(f"{target} exists: pass --overwrite to replace it, or another --output-file.")
    data = read_yaml_file(source, "Config file", "pass --config-file with the FSDP1 config to convert.")
    if not isinstance(data, dict):
        raise ValueError(f"Config file {source} is not a mapping of settings: pass an accel or Accelerate config.")
    accelerate = "fsdp_config" in data or "distributed_type" in data
    section_name, prefix = ("fsdp_config", "fsdp_") if accelerate else ("fsdp", "")
    section = data.get(section_name)
    if not isinstance(section, Mapping) or not section:
        raise ValueError(f"Config file {source} has no {section_name}: section: there are no FSDP settings to convert.")
    # A section without a version: FSDP1 in Accelerate, FSDP2 in accel (its default).
    version = next((section[k] for k in section if _is_version(str(k), prefix)), 2 if not accelerate else 1)
    if str(version).strip() == "2":
        print(f"accel to-fsdp2: {source} already sets FSDP2 (version 2): nothing to convert, nothing written.")
        return 0
    converted, notes = convert_section(section, prefix)
    result = {**data, section_name: converted}
    for note in notes:
        print(f"note: {section_name}.{note}", file=sys.stderr)
    if accelerate:
        _write_yaml(target, result)
    else:
        write_config_file(target, validate_config(result, f"the converted {source}"), "--output-file")
    print(f"accel to-fsdp2: wrote the FSDP2 config {target} (from {source}).")
    return 0


def convert_section(section: Mapping[str, Any], prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """The FSDP2 equivalent of an FSDP1 section, and one note per key changed or dropped.

    prefix: ``"fsdp_"`` for Accelerate's ``fsdp_config`` keys, ``""`` for accel's ``fsdp`` section.

    Example::

        convert_section({"version": 1, "sharding_strategy": "SHARD_GRAD_OP", "use_orig_params": True})
        # ({"version": 2, "reshard_after_forward": False}, [notes...])
    """
    converted: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in section.items():
        name = str(key).removeprefix(prefix).lower()
        if _is_version(str(key), prefix):
            converted[str(key)] = 2
        elif name == "sharding_strategy":
            strategy = str(value).strip().upper()
            if strategy == "NO_SHARD":
                raise ValueError(
                    f"{key}: NO_SHARD does not exist in FSDP2 (fully_shard always shards): use the DDP strategy "
                    "for pure data parallelism instead of converting."
                )
            if strategy not in RESHARD_AFTER_FORWARD:
                raise ValueError(f"{key}: {value!r} is not an FSDP sharding strategy: fix it before converting.")
            converted.setdefault(prefix + "reshard_after_forward", RESHARD_AFTER_FORWARD[strategy])
            if strategy in HYBRID:
                converted[str(key)] = strategy  # accel's FSDP2 lays an HSDP mesh (replicas x shards) for it
                notes.append(f"{key}: {strategy} kept (accel's FSDP2 runs it as HSDP), reshard_after_forward added")
            else:
                reshard = str(RESHARD_AFTER_FORWARD[strategy]).lower()
                notes.append(f"{key}: {strategy} became {prefix}reshard_after_forward: {reshard}")
        elif name == "reshard_after_forward":
            converted[str(key)] = _reshard_value(value)
        elif name in FSDP1_ONLY:
            notes.append(f"{key}: {value!r} dropped ({FSDP1_ONLY[name]})")
        else:
            converted[str(key)] = value
    if not any(_is_version(str(k), prefix) for k in section):
        converted[prefix + "version"] = 2
    return converted, notes


def _is_version(key: str, prefix: str) -> bool:
    return key.removeprefix(prefix).lower() in ("version", "fsdp_version")


def _reshard_value(value: Any) -> Any:
    """FSDP1 configs written by Accelerate's questions may hold a sharding strategy under reshard_after_forward."""
    if isinstance(value, str) and value.strip().upper() in RESHARD_AFTER_FORWARD:
        return RESHARD_AFTER_FORWARD[value.strip().upper()]
    return value


def _write_yaml(path: Path, data: Mapping[str, Any]) -> None:
    """Writes an Accelerate file as YAML, keys in their order (it is Accelerate's format, not checked here)."""
    import yaml

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False), encoding="utf-8")
    except OSError as error:
        raise ValueError(
            f"cannot write {path} ({error.strerror}): pass --output-file in a folder you can write to."
        ) from None
