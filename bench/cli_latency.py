"""Wall time of the `accel` command line against torchrun, measured side by side in one run.

- `accel --help`, `accel launch --help`, `accel config show` (no torch: goal < 0.3 s), and
  `accelerate --help` where Accelerate is installed;
- `accel launch --cpu -n 2 empty.py` against `torchrun --nproc_per_node 2 empty.py`: what accel adds
  to torchrun's own start-up (goal < 0.3 s);
- `accel launch --dry-run ...`: everything accel does before torch's agent starts (the part a launch adds).

Commands are interleaved repetition by repetition so that a change in machine load hits all of them
alike; the medians are printed with their ratios.

    uv run python bench/cli_latency.py [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _timed(command: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7, help="repetitions of each command (default 7)")
    reps = parser.parse_args().reps

    bin_dir = Path(sys.executable).parent
    accel = str(bin_dir / "accel")
    torchrun = str(bin_dir / "torchrun")
    work = tempfile.mkdtemp(prefix="accel-cli-bench-")
    Path(work, "empty.py").write_text("")
    # Same environment for every command: no user config, no ACCEL_* settings, OMP set (torchrun warns otherwise).
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env.update(XDG_CONFIG_HOME=str(Path(work, "xdg")), OMP_NUM_THREADS="1")

    light = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "accel --help": [accel, "--help"],
        "accel launch --help": [accel, "launch", "--help"],
        "accel config show": [accel, "config", "show"],
        "accel launch --dry-run": [accel, "launch", "--dry-run", "--cpu", "-n", "2", "empty.py"],
    }
    accelerate = shutil.which("accelerate", path=str(bin_dir)) or shutil.which("accelerate")
    if accelerate:
        light["accelerate --help"] = [accelerate, "--help"]
    jobs = {
        "torchrun --nproc_per_node 2": [torchrun, "--nproc_per_node", "2", "empty.py"],
        "accel launch --cpu -n 2": [accel, "launch", "--cpu", "-n", "2", "empty.py"],
    }

    times: dict[str, list[float]] = {name: [] for name in (*light, *jobs)}
    for command in light.values():  # warm the file cache once
        _timed(command, env, work)
    for _ in range(reps):
        for name, command in (*light.items(), *jobs.items()):
            times[name].append(_timed(command, env, work))
    median = {name: statistics.median(values) for name, values in times.items()}

    print(f"cli latency, median of {reps} (min .. max), {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    for name in times:
        print(f"  {name:30s} {median[name]:7.3f} s   ({min(times[name]):.3f} .. {max(times[name]):.3f})")
    base = median["torchrun --nproc_per_node 2"]
    launch = median["accel launch --cpu -n 2"]
    print(f"accel launch / torchrun: {launch / base:.3f}  (difference {launch - base:+.3f} s; goal < +0.3 s)")
    own = median["accel launch --dry-run"] - median["python -c pass"]
    print(f"accel's own work before torchrun's agent (dry run - python start-up): {own:.3f} s")
    print(f"accel --help / python -c pass: {median['accel --help'] / median['python -c pass']:.2f}")
    if accelerate:
        print(f"accelerate --help / accel --help: {median['accelerate --help'] / median['accel --help']:.1f}")
    else:
        print("accelerate is not installed: no reference measurement.")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
