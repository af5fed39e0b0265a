"""accel against raw PyTorch, Hugging Face Accelerate and Lightning Fabric: every scenario, the same machine, one run.

    uv run --group bench python bench/compare/run.py            # the full run (~25 min on 2 loaded CPU cores)
    uv run --group bench python bench/compare/run.py --quick    # CI smoke (< 3 min): fewer reps, smaller sizes

Frameworks alternate repetition by repetition (the order rotates) so that a change in machine load hits all of
them alike; each figure is the median over repetitions with its spread (interquartile range). Writes
bench/results/compare.json, compare.md (the table) and one PNG chart per scenario. The peers run in their own
environments (envs.py); a missing one is created, except under --quick, which skips it and says so.
Exits non-zero only when a scenario errors (never on a timing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import envs
from frameworks import FRAMEWORKS

HERE = Path(__file__).resolve().parent
WORKER, FIRST_STEP = str(HERE / "worker.py"), str(HERE / "first_step.py")
IMPORTS = {
    "raw": "import torch.distributed, torch.nn.parallel",
    "accel": "from accel import Accelerator; Accelerator",  # the attribute resolves accel's lazy export
    "accelerate": "from accelerate import Accelerator",
    "fabric": "from lightning_fabric import Fabric",
}
# Sharded strategies a peer cannot run on CPU raise; that is the finding (a note), not a failure of the run.
MAY_REFUSE = {
    ("fsdp2", "accelerate"),
    ("fsdp2", "fabric"),
    ("zero3", "accelerate"),
    ("zero3", "fabric"),
    ("zero3", "raw"),
}


def clean_env(framework: str = "accel") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "ACCELERATE_", "LT_", "PL_"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # DeepSpeed compiles its CPU ops on first use, keyed by the environment's paths: one cache per framework, so that
    # the environments do not rebuild over each other's (nor over the test suite's).
    env["TORCH_EXTENSIONS_DIR"] = str(envs.CACHE / "torch_extensions" / framework)
    return env


def timed(command: list[str], env: dict[str, str], cwd: str, timeout: float = 600) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2500:]}")
    return time.perf_counter() - start


def worker(framework: str, procs: int, scenarios: str, quick: bool, work: str, **options: str) -> dict:
    """One launch of worker.py in the framework's environment; returns its JSON (or {"error": ...})."""
    out = os.path.join(work, f"out-{framework}-{procs}-{time.monotonic_ns()}.json")
    py = envs.python(framework)
    launch = (
        [py, WORKER]
        if procs == 1
        else [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}", WORKER]
    )
    command = [*launch, "--framework", framework, "--scenarios", scenarios, "--out", out]
    command += ["--quick"] * quick + [f"--arg={k}={v}" for k, v in options.items()]
    done = subprocess.run(command, env=clean_env(framework), cwd=work, capture_output=True, text=True, timeout=900)
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
        os.remove(out)
        return result
    message = f"exit {done.returncode}: {(done.stderr or done.stdout)[-1500:]}"
    return {name: {"error": message} for name in scenarios.split(",")}


def _samples_from_summary(summary: dict) -> dict:
    return {
        scenario: {
            procs: {
                fw: {m: f["values"] if "values" in f else [f["value"]] for m, f in metrics.items()}
                for fw, metrics in by_fw.items()
            }
            for procs, by_fw in by_procs.items()
        }
        for scenario, by_procs in summary.items()
    }


class Results:
    """Samples per (scenario, processes, framework, metric), plus notes and errors."""

    def __init__(self) -> None:
        self.samples: dict[str, dict[str, dict[str, dict[str, list]]]] = {}
        self.notes: dict[str, dict[str, dict[str, str]]] = {}
        self.errors: list[str] = []

    def add(self, scenario: str, procs: int, framework: str, figures: dict) -> None:
        slot = self.samples.setdefault(scenario, {}).setdefault(str(procs), {}).setdefault(framework, {})
        for metric, value in figures.items():
            if metric in ("trace",) or metric.startswith("_"):
                continue
            slot.setdefault(metric, []).append(value)

    def restore(self, data: dict, keep: list[str] | None) -> None:
        """Takes the samples, notes and errors of scenarios `keep` from an earlier run's JSON."""
        if "samples" not in data:  # a JSON written before the samples were kept: back from the summary
            data = {**data, "samples": _samples_from_summary(data.get("summary", {}))}
        if keep is None:  # everything the JSON holds
            keep = sorted({*data["samples"], *data.get("notes", {})})
        for scenario in keep:
            if scenario in data.get("samples", {}):
                self.samples[scenario] = data["samples"][scenario]
            if scenario in data.get("notes", {}):
                self.notes[scenario] = data["notes"][scenario]
        self.errors += [e for e in data.get("errors", []) if e.split(" / ")[0] in keep]

    def note(self, scenario: str, procs: int, framework: str, text: str) -> None:
        self.notes.setdefault(scenario, {}).setdefault(str(procs), {})[framework] = text

    def take(self, scenario: str, procs: int, framework: str, figures: dict) -> None:
        if "error" in figures:
            if (scenario, framework) in MAY_REFUSE:
                self.note(scenario, procs, framework, "refused: " + figures["error"].strip().splitlines()[-1][:200])
            else:
                self.errors.append(f"{scenario} / {framework} / {procs} proc: {figures['error'][-600:]}")
                self.note(scenario, procs, framework, "error")
            return
        self.add(scenario, procs, framework, figures)


PHASES = {
    "startup": ("import", "cli_help", "launch"),
    "in-process": ("step", "loader", "gather", "checkpoint", "fsdp2", "zero3"),
    "correctness": ("resume", "crash"),
}


PHASES = {
    "startup": ("import", "cli_help", "launch"),
    "in-process": ("step", "loader", "gather", "checkpoint", "fsdp2", "zero3"),
    "correctness": ("resume", "crash"),
}


def rotated(frameworks: list[str], rep: int) -> list[str]:
    k = rep % len(frameworks)
    return frameworks[k:] + frameworks[:k]


def startup(results: Results, frameworks: list[str], reps: int, work: str) -> None:
    """Import time over `import torch`, `--help` latency, and launch-to-first-step on 1 and 2 processes."""
    env = clean_env()
    launchers = {
        "accel": lambda n: [envs.executable("accel"), "launch", "--cpu", "-n", str(n)],
        # `accelerate launch --cpu` starts one process unless MPI is installed; --multi_gpu goes through torchrun
        # and the script's Accelerator(cpu=True) then takes gloo on the CPU.
        "accelerate": lambda n: (
            [envs.executable("accelerate"), "launch", "--num_processes", str(n)]
            + (["--multi_gpu"] if n > 1 else ["--cpu"])
        ),
        "fabric": lambda n: [envs.executable("fabric"), "run", "--accelerator", "cpu", "--devices", str(n)],
        "raw": lambda n: [envs.executable("raw"), "--nproc_per_node", str(n)] if n > 1 else [envs.python("raw")],
    }
    for fw in frameworks:  # warm the file cache once
        timed([envs.python(fw), "-c", IMPORTS[fw]], env, work)
    for rep in range(reps):
        for fw in rotated(frameworks, rep):
            torch_s = timed([envs.python(fw), "-c", "import torch"], env, work)
            total = timed([envs.python(fw), "-c", IMPORTS[fw]], env, work)
            results.add("import", 1, fw, {"import_s": total, "over_torch_s": total - torch_s})
            results.add("cli_help", 1, fw, {"help_s": timed([envs.executable(fw), "--help"], env, work)})
            for n in (1, 2):
                out = os.path.join(work, f"first-{fw}-{n}.json")
                run_env = {**env, "BENCH_T0": repr(time.time())}
                try:
                    timed([*launchers[fw](n), FIRST_STEP, fw, out], run_env, work, timeout=300)
                    with open(out) as f:
                        results.add("launch", n, fw, json.load(f))
                except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                    results.take("launch", n, fw, {"error": str(exc)})


def in_process(
    results: Results, frameworks: list[str], reps: int, quick: bool, work: str, ckpt_dir: str | None
) -> None:
    """Step time, loader, gather (1 and 2 processes), checkpoint I/O (1) per repetition; FSDP2 / ZeRO-3 (2) once."""
    extra = {"dir": ckpt_dir} if ckpt_dir else {}
    for rep in range(reps):
        for fw in rotated(frameworks, rep):
            for name, figures in worker(fw, 1, "step,loader,gather,checkpoint", quick, work, **extra).items():
                results.take(name, 1, fw, figures)
            for name, figures in worker(fw, 2, "step,loader,gather", quick, work).items():
                results.take(name, 2, fw, figures)
    for fw in frameworks:  # once: the memory is exact, the step time a secondary figure
        for strategy in ("fsdp2", "zero3"):
            figures = worker(fw, 2, "sharded", quick, work, strategy=strategy)["sharded"]
            results.take(strategy, 2, fw, figures)
            if figures.get("param_fraction", 0) > 0.99:
                results.note(strategy, 2, fw, "ran, but did not shard (data parallel: every process holds all)")


def correctness(results: Results, frameworks: list[str], quick: bool, work: str) -> None:
    """Exact resume on 2 processes; crash safety (SIGKILL during an overwriting save) on 1."""
    fractions = ("0.5",) if quick else ("0.3", "0.7")
    for fw in frameworks:
        folder = tempfile.mkdtemp(prefix=f"resume-{fw}-", dir=work)
        first = worker(fw, 2, "resume", quick, work, phase="reference", dir=folder)["resume"]
        second = (
            worker(fw, 2, "resume", quick, work, phase="resume", dir=folder)["resume"]
            if "error" not in first
            else first
        )
        results.take("resume", 2, fw, second)
        trials = tempfile.mkdtemp(prefix=f"crash-{fw}-", dir=work)
        unkilled = 0
        for i, frac in enumerate(fractions):
            trial = os.path.join(trials, f"trial{i}")
            os.makedirs(trial)
            killed = worker(fw, 1, "crash", quick, work, phase="kill", dir=trial, frac=frac)
            if killed.get("crash", {}).get("killed") is False:
                unkilled += 1
        verdict = worker(fw, 1, "crash", quick, work, phase="verify", dir=trials)["crash"]
        if unkilled:
            verdict["unkilled_trials"] = unkilled
        results.take("crash", 1, fw, verdict)


def merge(paths: list[Path], out: Path) -> None:
    """One table from runs of separate phases (e.g. correctness run apart from the timings)."""
    import report

    results, metas, frameworks = Results(), [], []
    for path in paths:
        data = json.loads(path.read_text())
        results.restore(data, keep=None)
        metas.append(data["meta"])
        frameworks += [fw for fw in data["frameworks"] if fw not in frameworks]
    meta = {**metas[0], "phases": [p for m in metas for p in m["phases"]], "runs": metas}
    meta["load_at_end"] = max(m["load_at_end"] for m in metas)
    print(report.write(results, meta, [fw for fw in FRAMEWORKS if fw in frameworks], out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI smoke: < 3 min, skips peers not installed")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma-separated subset")
    parser.add_argument("--reps", type=int, default=None, help="start-up repetitions; in-process: one less (default 3)")
    parser.add_argument("--out", default=str(HERE.parent / "results"), help="folder for JSON, table and charts")
    parser.add_argument("--ckpt-dir", default=None, help="where checkpoints are written (default: temp folder)")
    parser.add_argument("--no-install", action="store_true", help="skip peers whose environment is missing")
    parser.add_argument(
        "--phases",
        default="startup,in-process,correctness",
        help="subset to run; the other phases' figures are kept from an earlier run's JSON in --out",
    )
    parser.add_argument(
        "--merge", nargs="+", default=None, help="JSON files of runs of different phases: writes their union to --out"
    )
    args = parser.parse_args()
    if args.merge:
        merge([Path(p) for p in args.merge], Path(args.out))
        return
    reps = args.reps or (1 if args.quick else 3)
    in_reps = max(1, reps - 1)  # each in-process launch already takes the median of several rounds inside
    phases = args.phases.split(",")
    frameworks = []
    for fw in args.frameworks.split(","):
        if not envs.installed(fw):
            if args.quick or args.no_install:
                print(f"skipping {fw}: its environment {envs.env_dir(fw)} is not installed (run without --quick)")
                continue
            print(f"installing {fw} into {envs.env_dir(fw)} ...", flush=True)
            envs.install(fw)
        frameworks.append(fw)
    started = time.time()
    results = Results()
    with tempfile.TemporaryDirectory(prefix="accel-compare-") as work:
        for label, step in (
            ("startup", lambda: startup(results, frameworks, reps, work)),
            ("in-process", lambda: in_process(results, frameworks, in_reps, args.quick, work, args.ckpt_dir)),
            ("correctness", lambda: correctness(results, frameworks, args.quick, work)),
        ):
            if label not in phases:
                continue
            t0 = time.time()
            step()
            print(f"{label}: {time.time() - t0:.0f} s", flush=True)
    # Read only now, so that a run of the other phases started alongside this one has written its figures.
    earlier = Path(args.out) / ("compare-quick.json" if args.quick else "compare.json")
    if set(phases) != set(PHASES) and earlier.exists():
        kept = [scenario for phase in PHASES if phase not in phases for scenario in PHASES[phase]]
        results.restore(json.loads(earlier.read_text()), keep=kept)

    import report

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "quick": args.quick,
        "reps": reps,
        "in_process_reps": in_reps,
        "phases": phases,
        "cpus": os.cpu_count(),
        "load_at_end": os.getloadavg()[0],
        "seconds": round(time.time() - started),
        "versions": {fw: envs.versions(fw) for fw in frameworks},
    }
    summary = report.write(results, meta, frameworks, Path(args.out))
    print(summary)
    if results.errors:
        print("\nscenarios that errored:\n" + "\n".join(results.errors), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
