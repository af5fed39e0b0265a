"""The Python interpreter of each framework: accel and raw PyTorch run in the workspace's environment; Hugging Face
Accelerate and Lightning Fabric each in an isolated virtual environment under ~/.cache/accel-bench (created with
`uv venv` + `uv pip install`, with the workspace's own torch version so that torch is not the difference), never
as dependencies of accel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("ACCEL_BENCH_CACHE", Path.home() / ".cache" / "accel-bench"))
# `click` is what lightning-fabric's `fabric` command needs (an optional dependency of the package); deepspeed for
# the ZeRO-3 scenario, at the workspace's version.
PEERS = {"accelerate": ["accelerate==1.*"], "fabric": ["lightning-fabric==2.*", "click"]}
CLI = {"accel": "accel", "raw": "torchrun", "accelerate": "accelerate", "fabric": "fabric"}


def workspace_python() -> str:
    return sys.executable


def env_dir(framework: str) -> Path:
    return CACHE / f"{framework}-env"


def python(framework: str) -> str:
    if framework in ("accel", "raw"):
        return workspace_python()
    return str(env_dir(framework) / "bin" / "python")


def executable(framework: str) -> str:
    """The framework's command-line entry point (raw PyTorch's is torchrun)."""
    return str(Path(python(framework)).parent / CLI[framework])


def installed(framework: str) -> bool:
    return Path(python(framework)).exists() and Path(executable(framework)).exists()


def versions(framework: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json\n"
        "out = {}\n"
        "for d in ('torch', 'accel', 'accelerate', 'lightning-fabric'):\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    import json

    found = json.loads(
        subprocess.run([python(framework), "-c", code], capture_output=True, text=True, check=True).stdout
    )
    keep = {
        "accel": ("torch", "accel"),
        "raw": ("torch",),
        "accelerate": ("torch", "accelerate"),
        "fabric": ("torch", "lightning-fabric"),
    }[framework]
    return {k: v for k, v in found.items() if k in keep}


def install(framework: str) -> None:
    """Creates (or completes) the isolated environment of a peer framework with the workspace's torch."""
    import torch

    torch_version = torch.__version__.split("+")[0]
    target = env_dir(framework)
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (target / "bin" / "python").exists():
        subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(target)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(target)}
    env.pop("UV_PROJECT_ENVIRONMENT", None)
    import importlib.metadata

    deepspeed = f"deepspeed=={importlib.metadata.version('deepspeed')}"
    subprocess.run(
        ["uv", "pip", "install", "-q", f"torch=={torch_version}", "numpy", deepspeed, *PEERS[framework]],
        env=env,
        check=True,
    )
