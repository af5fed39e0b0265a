"""``accel env``: the block to paste into a bug report (versions, backends, devices, resolved config)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

from accel_core import discovery
from accel_launch.config import load_config
from accel_launch.plan import resolve_plan

from .common import format_env, format_settings

# Entry-point groups through which packages add to accel (see accel_core.discovery).
GROUPS = ("accel.strategies", "accel.preparers", "accel.checkpoint", "accel.trackers", "accel.cli")


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def torch_version() -> str:
    """torch's full version with its build tag (``2.9.0+cu128``), read from ``torch/version.py`` without importing
    torch: the wheel's metadata often drops the tag, and the tag says which CUDA (or CPU-only) build runs."""
    spec = importlib.util.find_spec("torch")  # a top-level name: found without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            text = (Path(folder) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        found = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", text, re.M)
        if found:
            return found.group(1)
    return _version("torch")


def _trackers() -> str:
    """The registered trackers: those whose library is missing marked with the install that adds it, those installed
    but not ready to start unasked (wandb without a login) marked so."""
    listed = []
    for name in discovery.available("accel.trackers"):
        try:
            tracker = discovery.load("accel.trackers", name)
            library = getattr(tracker, "library", None)  # GeneralTracker's declared ClassVar (None: no library)
            installed = library is None or importlib.util.find_spec(library) is not None  # no import
            ready = installed and bool(tracker.is_available())  # accel_core.protocols.Tracker's classmethod
        except Exception as error:  # noqa: BLE001 - a report must still come out
            listed.append(f"{name} (cannot load: {type(error).__name__}: {error})")
            continue
        if not installed:
            extra = getattr(tracker, "extra", None)
            install = f'pip install "accel-tracking[{extra}]"' if extra else f"pip install {library}"
            listed.append(f"{name} (library not installed: {install})")
        elif not ready:
            listed.append(f"{name} (installed; not ready to start unasked, log_with='all' leaves it out)")
        else:
            listed.append(name)
    return ", ".join(listed) or "(none)"


# The libraries accel's packages drive, whose versions a bug usually depends on (metadata only: nothing is imported).
LIBRARIES = (
    "numpy", "safetensors", "deepspeed", "megatron-core", "torchao", "transformer-engine", "transformers",
    "torchdata", "tensorboard", "wandb", "mlflow", "comet-ml",
)  # fmt: skip


def _libraries() -> str:
    versions = {name: _version(name) for name in LIBRARIES}
    found = [f"{name} {found}" for name, found in versions.items() if found != "not installed"]
    return ", ".join(found) or "(none)"


def _memory() -> str:
    """This machine's RAM and what is free now (/proc/meminfo; other systems: unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            fields = {line.split(":")[0]: int(line.split()[1]) for line in handle if line.split()[1:2]}
    except (OSError, ValueError, IndexError):
        return "unknown"
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    if total is None:
        return "unknown"
    text = f"{total / 2**20:.1f} GiB"
    return text + (f" ({available / 2**20:.1f} GiB available)" if available is not None else "")


def _accel_distributions() -> list[str]:
    names = {d.metadata["Name"] for d in distributions() if d.metadata["Name"]}
    return sorted(n for n in names if n.lower() == "accel" or n.lower().startswith(("accel-", "accel_")))


def _devices() -> str:
    try:
        from accel_launch.devices import detect_devices

        devices = detect_devices()
    except Exception as error:  # noqa: BLE001 - a report must still come out
        return f"could not detect: {type(error).__name__}: {error}"
    names = ", ".join(devices.names)
    text = f"{devices.kind} x {devices.count}" + (f" ({names})" if names else "")
    return text + (f", {devices.detail}" if devices.detail else "")


# torch-xla's runtime settings worth a bug report (PJRT device, TPU topology, bf16 switches).
_XLA_VARIABLES = ("PJRT_DEVICE", "XLA_DOWNCAST_BF16", "XLA_USE_BF16", "TPU_NUM_DEVICES", "TPU_ACCELERATOR_TYPE")


def xla_runtime(environ: Mapping[str, str]) -> str:
    """torch-xla's version, libtpu's, and the runtime's variables (package metadata and environment only: torch_xla
    is not imported, it would start the runtime)."""
    torch_xla = _version("torch-xla")
    if torch_xla == "not installed":
        return "torch-xla not installed"
    torch = _version("torch")
    parts = [f"torch-xla {torch_xla}"]
    if torch_xla.split(".")[:2] != torch.split("+")[0].split(".")[:2]:
        parts.append(f"MISMATCH: torch {torch} (torch-xla {torch_xla} needs the same major.minor release)")
    libtpu = _version("libtpu")
    parts.append(f"libtpu {libtpu}")
    parts += [f"{name}={environ[name]}" for name in _XLA_VARIABLES if environ.get(name)]
    if not environ.get("PJRT_DEVICE"):
        parts.append("PJRT_DEVICE not set (torch-xla picks TPU when there is one, else CPU)")
    return ", ".join(parts)


def report(config_file: str | None = None) -> str:
    """The report text (torch is not imported: versions come from package metadata, devices from the system).

    config_file: the config file to resolve (default: the one ``accel launch`` reads)."""
    lines = [
        f"- platform: {platform.platform()}",
        f"- python: {sys.version.split()[0]} ({sys.executable})",
        f"- torch: {torch_version()}",
    ]
    lines += [f"- {name}: {_version(name)}" for name in _accel_distributions()]
    for group in GROUPS:
        found = _trackers() if group == "accel.trackers" else ", ".join(discovery.available(group)) or "(none)"
        lines.append(f"- {group}: {found}")
    lines.append(f"- libraries: {_libraries()}")
    lines.append(f"- devices: {_devices()}")
    lines.append(f"- memory: {_memory()}")
    lines.append(f"- XLA runtime: {xla_runtime(os.environ)}")
    try:
        config, path = load_config(config_file)
        plan = resolve_plan({}, os.environ, config, config_file=str(path) if path else None)
    except ValueError as error:
        lines.append(f"- config: invalid: {error}")
    else:
        lines.append(f"- config file: {path or '(none)'}")
        lines.append(f"- settings (environment > config file > default):\n{format_settings(plan)}")
        lines.append(f"- added to the workers' environment:\n{format_env(plan.env)}")
    set_vars = {k: v for k, v in os.environ.items() if k.startswith("ACCEL_")}
    lines.append(f"- ACCEL_* set in this shell:\n{format_env(set_vars)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="accel env", description=__doc__)
    parser.add_argument(
        "--config-file",
        "--config_file",
        dest="config_file",
        metavar="PATH",
        help="the config file to report (default: the one `accel launch` reads, see `accel config show`)",
    )
    args = parser.parse_args(argv)
    print("Copy-and-paste the text below in your bug report.\n")
    print(report(args.config_file))
    return 0
