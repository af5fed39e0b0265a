"""What this machine can run on, for ``accel config default`` and ``accel env``, without importing torch.

Importing torch costs seconds, and these commands must stay instant (DESIGN.md), so the answer is
put together from what the system shows: the GPUs the driver lists (``nvidia-smi``, else
``/proc/driver/nvidia``; the ROCm kernel driver's topology in ``/sys/class/kfd``; Intel render
nodes in ``/sys/class/drm``), filtered by the ``*_VISIBLE_DEVICES`` variables as torch would
apply them, and which of those kinds the installed torch was built for (read from
``torch/version.py`` as text). A GPU that torch's build cannot use is not counted.
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Devices:
    """The accelerators torch would see: ``kind`` is cuda, xpu, mps or cpu; ``count`` how many (1 for cpu)."""

    kind: str
    count: int
    names: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def has_accelerator(self) -> bool:
        return self.kind != "cpu"


def torch_build() -> dict[str, str | None]:
    """``torch.version``'s fields (``__version__``, ``cuda``, ``hip``, ``xpu``) read as text, without importing torch.

    Empty when torch is not installed.
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError):
        return {}
    fields: dict[str, str | None] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, (str, type(None)))
        ):
            fields[target.id] = value.value
    return fields


def visible(devices: list[tuple[str, str]], variable: str | None, environ: dict[str, str]) -> list[tuple[str, str]]:
    """The ``(id, name)`` devices left by a ``*_VISIBLE_DEVICES`` list of indices or id prefixes.

    As the CUDA runtime does: unset keeps all, an empty value none, and the list stops at its
    first entry that names no device. MIG instances (``MIG-<uuid>``) are counted as named.
    """
    value = environ.get(variable) if variable else None
    if value is None:
        return devices
    chosen: list[tuple[str, str]] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry.isdigit() and int(entry) < len(devices):
            match = devices[int(entry)]
        elif entry.startswith("MIG-"):
            match = (entry, "MIG instance")
        else:
            match = next((d for d in devices if entry and d[0].startswith(entry)), None)
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def nvidia_gpus(proc_root: str = "/proc") -> list[tuple[str, str]]:
    """``(uuid, name)`` of every NVIDIA GPU: from ``nvidia-smi``, else the kernel driver's ``/proc`` files."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            result = subprocess.run(
                [smi, "--query-gpu=uuid,name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
            )
        except (OSError, subprocess.SubprocessError):
            result = None
        if result is not None and result.returncode == 0:
            rows = [line.split(",", 1) for line in result.stdout.splitlines() if "," in line]
            return [(uuid.strip(), name.strip()) for uuid, name in rows]
    gpus = []
    for info in sorted(glob.glob(os.path.join(proc_root, "driver/nvidia/gpus/*/information"))):
        fields = dict(line.split(":", 1) for line in _read(info).splitlines() if ":" in line)
        gpus.append((fields.get("GPU UUID", "").strip(), fields.get("Model", "NVIDIA GPU").strip()))
    return gpus


def amd_gpus(sys_root: str = "/sys") -> list[tuple[str, str]]:
    """``(index, gfx target)`` of every GPU node the ROCm kernel driver (kfd) lists; CPU nodes have no SIMDs."""
    gpus = []
    nodes = glob.glob(os.path.join(sys_root, "class/kfd/kfd/topology/nodes/*/properties"))
    for properties in sorted(nodes, key=lambda p: int(os.path.basename(os.path.dirname(p)))):
        values = dict(line.split(None, 1) for line in _read(properties).splitlines() if " " in line)
        if int(values.get("simd_count", "0")) > 0:
            name = _read(os.path.join(os.path.dirname(properties), "name")).strip() or "AMD GPU"
            gpus.append((str(len(gpus)), name))
    return gpus


def intel_gpus(sys_root: str = "/sys") -> list[tuple[str, str]]:
    """``(index, name)`` of every Intel render node (what the Level Zero runtime enumerates)."""
    gpus = []
    for node in sorted(glob.glob(os.path.join(sys_root, "class/drm/renderD*"))):
        if _read(os.path.join(node, "device/vendor")).strip() == "0x8086":
            device = _read(os.path.join(node, "device/device")).strip()
            gpus.append((str(len(gpus)), f"Intel GPU {device}".strip()))
    return gpus


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _first_set(environ: dict[str, str], *names: str) -> str | None:
    return next((n for n in names if n in environ), None)


def detect_devices(environ: dict[str, str] | None = None) -> Devices:
    """The accelerators a torch process started here would see (respects ``CUDA_VISIBLE_DEVICES`` & co).

    Example::

        devices = detect_devices()
        num_processes = devices.count if devices.kind in ("cuda", "xpu") else 1
    """
    environ = dict(os.environ if environ is None else environ)
    build = torch_build()
    if build.get("cuda"):
        gpus = visible(nvidia_gpus(), "CUDA_VISIBLE_DEVICES", environ)
        if gpus:
            return Devices("cuda", len(gpus), [name for _, name in gpus], f"CUDA {build['cuda']}")
    if build.get("hip"):
        gpus = visible(
            amd_gpus(),
            _first_set(environ, "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
            environ,
        )
        if gpus:
            return Devices("cuda", len(gpus), [name for _, name in gpus], f"ROCm {build['hip']}")
    if build.get("xpu"):
        gpus = visible(intel_gpus(), "ZE_AFFINITY_MASK", environ)
        if gpus:
            return Devices("xpu", len(gpus), [name for _, name in gpus])
    if sys.platform == "darwin" and platform.machine() == "arm64" and build:
        return Devices("mps", 1, ["Apple MPS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return Devices("cpu", 1, [], f"{cores} cores")
