"""Wall time of the `accel` command line against torchrun, measured side by side in one run.

- `accel --help`, `accel launch --help`, `accel config show` (no torch: goal < 0.3 s), and
  `accelerate --help` where Accelerate is installed;
- `accel launch --cpu -n 2 empty.py` against `torchrun --nproc_per_node 2 empty.py`: what accel adds
  to torchrun's own start-up (goal < 0.3 s);
- `accel launch --dry-run ...`: everything accel does before torch's agent starts (the part a launch adds);
- `import accel` in a fresh interpreter;
- with `--against CHECKOUT` (another clone with its own `uv sync`ed `.venv`, e.g. a worktree at an older
  commit): its `accel --help` and `import accel` in the same interleaved rounds, as a before/after.

Commands are interleaved repetition by repetition so that a change in machine load hits all of them
alike; the medians are printed with their ratios.

    uv run python bench/cli_latency.py [--reps 7] [--against ../accel-before]
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
    parser.add_argument("--against", type=Path, help="another checkout with a synced .venv: before/after rows")
    args = parser.parse_args()
    reps = args.reps

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
        "import accel": [sys.executable, "-c", "import accel"],
    }
    if args.against is not None:
        other_bin = args.against.resolve() / ".venv" / "bin"
        commit = subprocess.run(
            ["git", "-C", str(args.against), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        light[f"accel --help @{commit}"] = [str(other_bin / "accel"), "--help"]
        light[f"import accel @{commit}"] = [str(other_bin / "python"), "-c", "import accel"]
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
    for name in [n for n in times if "@" in n]:
        here = name.split(" @")[0]
        print(f"{here}: this checkout / {name.split()[-1]}: {median[here] / median[name]:.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
