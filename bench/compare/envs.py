"""The Python interpreter of each framework: accel and raw PyTorch run in the workspace's environment; Hugging Face
Accelerate and Lightning Fabric each in an isolated virtual environment under ~/.cache/accel-bench (created with
`uv venv` + `uv pip install`, with the workspace's own torch version so that torch is not the difference), never
as dependencies of accel. `prepare` makes a framework ready to be measured: it creates a missing environment and
builds, once, the DeepSpeed CPU op that a ZeRO-3 run compiles on first use (minutes on 2 cores), so that neither
lands inside a timed launch.
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


def extensions_dir(framework: str) -> Path:
    """Where DeepSpeed's JIT-built ops go: one folder per framework, because a build is keyed by its environment's
    paths (one shared folder would be rebuilt each time another environment uses it)."""
    return CACHE / "torch_extensions" / framework


# The frameworks whose ZeRO-3 run initializes DeepSpeed's communication: accel, and raw (DeepSpeed used directly);
# Accelerate's CPU run does not (it falls back to data parallel), Fabric refuses ZeRO-3 on CPU. raw shares accel's
# interpreter but builds into its own TORCH_EXTENSIONS_DIR (clean_env gives each framework one).
BUILDS_OPS = ("accel", "raw")
# Exactly what DeepSpeed's TorchBackend does at init (deepspeed.comm.torch.build_shm_op), done ahead of time.
_BUILD_OPS = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"


def _ops_marker(framework: str) -> Path:
    import hashlib

    return extensions_dir(framework) / f".built-for-{hashlib.sha1(python(framework).encode()).hexdigest()[:12]}"


def ops_built(framework: str) -> bool:
    return framework not in BUILDS_OPS or _ops_marker(framework).exists()


def build_ops(framework: str) -> None:
    target = extensions_dir(framework)
    target.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(target)}
    subprocess.run([python(framework), "-c", _BUILD_OPS], env=env, check=True, capture_output=True)
    _ops_marker(framework).write_text(python(framework) + "\n")


def prepare(framework: str, create: bool = True) -> bool:
    """Makes `framework` ready (False: its environment is missing and `create` is off); prints what it did."""
    import time

    if not installed(framework):
        if not create:
            print(f"skipping {framework}: its environment {env_dir(framework)} is not installed")
            return False
        start = time.time()
        print(f"installing {framework} into {env_dir(framework)} ...", flush=True)
        install(framework)
        print(f"installed {framework} in {time.time() - start:.0f} s", flush=True)
    start = time.time()
    compile_bytecode(framework)
    if time.time() - start > 2:
        print(f"compiled {framework}'s environment to bytecode in {time.time() - start:.0f} s (once)", flush=True)
    if not ops_built(framework):
        start = time.time()
        print(f"building DeepSpeed's CPU communication op for {framework} (once) ...", flush=True)
        build_ops(framework)
        print(f"built it in {time.time() - start:.0f} s", flush=True)
    return True


def compile_bytecode(framework: str) -> None:
    """Compiles the framework's environment (and, for accel and raw, the workspace's packages) to bytecode, as a
    user's install has it (pip and uv compile at install; Python caches what it imports): a launch then measures
    the import, not Python compiling torch from source. A shell with PYTHONDONTWRITEBYTECODE set and a plain
    `uv sync` leave none: every process compiled torch and accel again (about 2x the CPU of a launch; accel's own
    ~100 modules cost its launches more than raw's). Up-to-date files are skipped: about 10 s per environment when
    nothing changed."""
    paths = subprocess.run(
        [python(framework), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if framework in ("accel", "raw"):
        paths += [str(p) for p in sorted((Path(__file__).resolve().parents[2] / "packages").glob("*/src"))]
    # Exit status 1 when some file does not compile (templates and Python-2 files some packages ship): those are
    # never imported, so it is no error here.
    subprocess.run([python(framework), "-m", "compileall", "-q", "-j", "0", *paths], capture_output=True)


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
