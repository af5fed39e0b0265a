"""accel against raw PyTorch, Hugging Face Accelerate and Lightning Fabric: every scenario, the same machine, one run.

    uv run --group bench python bench/compare/run.py            # the full run (5 alternating launches each)
    uv run --group bench python bench/compare/run.py --quick    # CI smoke: 1 launch each, tiny sizes, < 3 min

Frameworks alternate repetition by repetition (the order rotates) so that a change in machine load hits all of
them alike; each figure is the median over repetitions with its spread (interquartile range). Writes, in one go,
bench/results/compare.json, compare.md (the table), one PNG chart per scenario and the tables in
bench/results/README.md and the root README (report.py); --quick writes compare-quick.json / .md only. --quick is a
smoke test of every scenario for every framework, not a measurement: besides one launch and tiny sizes, it runs two
frameworks at a time and forks its worker launches from one zygote per framework (zygote.py: torch and the
framework imported once), where the full run starts each one fresh; its start-up rows (`--help`, launch to first
step) are fresh processes in both. The peers run in their own environments (envs.py), created on first use.
Exits non-zero only when a scenario errors (never on a timing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import envs
from first_step import IMPORTS
from frameworks import FRAMEWORKS
from zygote import Zygote, Zygotes, wait_ranks
from zygote import cpu_seconds as own_cpu_seconds

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
WORKER, FIRST_STEP = str(HERE / "worker.py"), str(HERE / "first_step.py")
# Sharded strategies a peer cannot run on CPU raise; that is the finding (a note), not a failure of the run.
MAY_REFUSE = {
    ("fsdp2", "accelerate"),
    ("fsdp2", "fabric"),
    ("zero3", "accelerate"),
    ("zero3", "fabric"),
}


def clean_env(framework: str = "accel") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "ACCELERATE_", "LT_", "PL_"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # As on a user's machine, Python caches the bytecode of what it imports (envs.compile_bytecode did the rest).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # DeepSpeed compiles its CPU ops on first use, keyed by the environment's paths: one cache per framework, so that
    # the environments do not rebuild over each other's (nor over the test suite's).
    env["TORCH_EXTENSIONS_DIR"] = str(envs.extensions_dir(framework))
    return env


def cpu_seconds() -> float:
    """CPU time of this process and every finished child (launchers wait for theirs, so workers count too)."""
    forked = ZYGOTES.cpu() if ZYGOTES is not None else 0.0  # reaped by the zygotes, not yet by this process
    return own_cpu_seconds() + forked


# Every launch: (what, framework, wall seconds, CPU seconds or None), so that a run shows where its time went. The
# CPU time is that of the finished children, known per launch only when launches do not overlap, or when a zygote
# forked them (--quick: it counts its children's; its own start-up, its imports, is in no launch's figure).
LAUNCHES: list[tuple[str, str, float, float | None]] = []


def launch(what: str, framework: str, command: list[str], env: dict[str, str], cwd: str, timeout: float):
    check_stop()
    alone = threading.current_thread() is threading.main_thread()
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
        return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    finally:
        LAUNCHES.append((what, framework, time.perf_counter() - start, cpu_seconds() - cpu if alone else None))


def launch_costs() -> dict[str, dict[str, float | int | None]]:
    """Per kind of launch: how many, their total and median wall time, and their CPU time where known."""
    kinds: dict[str, list[tuple[float, float | None]]] = {}
    for what, fw, wall, cpu in LAUNCHES:
        kinds.setdefault(f"{what} / {fw}", []).append((wall, cpu))
    out: dict[str, dict[str, float | int | None]] = {}
    for kind, items in sorted(kinds.items()):
        cpus = [c for _, c in items if c is not None]
        out[kind] = {
            "n": len(items),
            "wall_s": round(sum(w for w, _ in items), 1),
            "median_wall_s": round(sorted(w for w, _ in items)[len(items) // 2], 2),
            "cpu_s": round(sum(cpus), 1) if cpus else None,
        }
    return out


def timed(what: str, framework: str, command: list[str], env: dict[str, str], cwd: str, timeout: float = 600) -> float:
    start = time.perf_counter()
    done = launch(what, framework, command, env, cwd, timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2500:]}")
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_envs(env: dict[str, str], procs: int) -> list[dict[str, str]]:
    """The environment of each of `procs` ranks: what torchrun gives its workers (what every framework reads to
    join the group, Fabric's torchelastic detection included). One process gets no such variables (a plain
    `python script.py`)."""
    if procs == 1:
        return [dict(env)]
    port, run_id = str(free_port()), f"bench-{time.monotonic_ns()}"
    return [
        {
            **env,
            **dict.fromkeys(("RANK", "LOCAL_RANK", "ROLE_RANK"), str(rank)),
            **dict.fromkeys(("WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE"), str(procs)),
            **dict.fromkeys(("GROUP_RANK", "TORCHELASTIC_RESTART_COUNT"), "0"),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "TORCHELASTIC_RUN_ID": run_id,
        }
        for rank in range(procs)
    ]


def run_ranks(command: list[str], procs: int, env: dict[str, str], cwd: str, timeout: float) -> tuple[int, str]:
    """Starts `procs` copies of `command` with the environments of rank_envs, without torchrun itself: its own
    `import torch` would add seconds of CPU to each of the run's many worker launches. If one rank fails, the
    others are stopped; returns the exit code and the stderr of the first failing rank (else rank 0's)."""
    with contextlib.ExitStack() as stack:  # files, not pipes: a chatty rank cannot block on a full pipe
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(procs)]
        ranks = [
            subprocess.Popen(command, env=rank_env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=log)
            for rank_env, log in zip(rank_envs(env, procs), logs, strict=True)
        ]
        wait_ranks(lambda: [p.poll() for p in ranks], timeout)
        for p in ranks:
            if p.poll() is None:
                p.kill()
        codes = [p.wait() for p in ranks]
        failed = next((i for i, c in enumerate(codes) if c != 0), 0)
        logs[failed].seek(0)
        return codes[failed], logs[failed].read()


def fork_ranks(zygote: Zygote, argv: list[str], procs: int, env: dict[str, str], cwd: str, timeout: float):
    """run_ranks through a zygote (--quick): the ranks are forked from a process that has imported torch and the
    framework already, with the same environments, the same waiting and the same answer, plus the ranks' CPU
    seconds."""
    with tempfile.TemporaryDirectory(prefix="logs-") as logs_dir:
        logs = [os.path.join(logs_dir, f"rank{rank}.log") for rank in range(procs)]
        codes, cpu = zygote.run(argv, rank_envs(env, procs), cwd, logs, timeout)
        failed = next((i for i, c in enumerate(codes) if c != 0), 0)
        with open(logs[failed], errors="replace") as f:
            return codes[failed], f.read(), cpu


# Under --quick, the framework's zygote (zygote.py) forks the worker launches; set by main() for the run's length.
ZYGOTES: Zygotes | None = None


def worker(framework: str, procs: int, scenarios: str, quick: bool, work: str, **options: str) -> dict:
    """One launch of worker.py in the framework's environment (`procs` ranks), forked from the framework's zygote
    under --quick; returns its JSON (or {"error": ...})."""
    out = os.path.join(work, f"out-{framework}-{procs}-{time.monotonic_ns()}.json")
    argv = [WORKER, "--framework", framework, "--scenarios", scenarios, "--out", out]
    argv += ["--quick"] * quick + [f"--arg={k}={v}" for k, v in options.items()]
    check_stop()
    alone = threading.current_thread() is threading.main_thread()
    try:
        zygote = ZYGOTES.get(framework) if ZYGOTES is not None else None  # started on first use: not timed here
        start, cpu = time.perf_counter(), cpu_seconds()
        if zygote is not None:
            code, stderr, used = fork_ranks(zygote, argv, procs, clean_env(framework), work, 900)
        else:
            code, stderr = run_ranks([envs.python(framework), *argv], procs, clean_env(framework), work, 900)
            used = cpu_seconds() - cpu if alone else None
    except RuntimeError as exc:  # the zygote could not start, or died
        return {name: {"error": str(exc)[-1500:]} for name in scenarios.split(",")}
    wall = time.perf_counter() - start
    LAUNCHES.append((f"worker {procs}p {scenarios}", framework, wall, used))
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
        os.remove(out)
        return result
    message = f"exit {code}: {stderr[-1500:]}"
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
    "in-process": ("step", "loader", "gather", "checkpoint"),
    "sharded": ("fsdp2", "zero3"),
    "correctness": ("resume", "crash"),
}


class Plan:
    """How much each phase repeats: the full run (medians worth quoting) or --quick (a smoke test of every scenario
    for every framework, < 3 min on a quiet 2-core machine: one repetition, tiny sizes, one process where the
    scenario allows it; main() adds the zygotes)."""

    def __init__(self, quick: bool, reps: int | None) -> None:
        self.quick = quick
        self.reps = reps or (1 if quick else 5)  # start-up and in-process launches per framework, alternating
        self.launch_procs = (1,) if quick else (1, 2)
        # A 2-process launch starts 3 interpreters (launcher + 2 ranks), each importing torch: ~4 s each, and its
        # spread between launches (0.4 s) is wider than the gaps between frameworks: as many launches as the others
        # (3 left the row's verdict to chance: a 12-round A/B put accel 0.2 s ahead where 3 launches put it behind).
        self.launch2_reps = self.reps
        # The few-hundred-MB checkpoint costs seconds per save: fewer launches (each the median of its rounds).
        self.checkpoint_reps = 1 if quick else min(self.reps, 3)
        self.warm_cache = not quick  # one untimed import per framework before the timed ones
        self.crash_fractions = ("0.5",) if quick else ("0.3", "0.7")
        # FSDP2 / ZeRO-3: the memory figure is exact in one launch; the step time, a median of 3 rotated launches.
        self.sharded_reps = 1 if quick else min(self.reps, 3)


def each(frameworks: list[str], task, parallel: bool) -> None:
    """Runs `task(framework)` for every framework: one after another (timed runs must not share the CPUs), or two
    at a time under --quick, a smoke test whose figures are not for quoting: its wall time is then bounded by the
    CPU time of its launches over the cores rather than by their sum. The tasks of
    different frameworks write different keys of `Results` (dict.setdefault and list.append are atomic)."""
    if not parallel:
        for fw in frameworks:
            task(fw)
        return
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        for future in [pool.submit(task, fw) for fw in frameworks]:
            future.result()
    except BaseException:  # Ctrl-C (only the main thread sees it) or an error: the other task stops at its next
        STOP.set()  # launch, the queued ones never start
        pool.shutdown(cancel_futures=True)
        raise
    pool.shutdown()


class Stopped(Exception):
    """Raised by a launch asked for after the run was stopped (STOP)."""


# Set when the run is being stopped: a task running on a pool thread makes no further launch.
STOP = threading.Event()


def check_stop() -> None:
    if STOP.is_set():
        raise Stopped("the run was stopped")


def rotated(frameworks: list[str], rep: int) -> list[str]:
    k = rep % len(frameworks)
    return frameworks[k:] + frameworks[:k]


def startup(results: Results, frameworks: list[str], plan: Plan, work: str) -> None:
    """`--help` latency and launch-to-first-step (1 and 2 processes); the 1-process launch also reports the import
    time over `import torch` (both timed inside that fresh process: no separate launch for it)."""
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
    if plan.warm_cache:  # one untimed import per framework, so that the first timed one is not a cold read
        for fw in frameworks:
            module, name = IMPORTS[fw]
            timed("warm import", fw, [envs.python(fw), "-c", f"import {module}; {module}.{name}"], env, work)

    def one(fw: str, rep: int) -> None:
        try:
            help_s = timed("--help", fw, [envs.executable(fw), "--help"], env, work)
            results.add("cli_help", 1, fw, {"help_s": help_s})
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            results.take("cli_help", 1, fw, {"error": str(exc)})
        for n in plan.launch_procs:
            if n > 1 and rep >= plan.launch2_reps:
                continue
            out = os.path.join(work, f"first-{fw}-{n}.json")
            run_env = {**env, "BENCH_T0": repr(time.time())}
            try:
                timed(f"first step {n}p", fw, [*launchers[fw](n), FIRST_STEP, fw, out], run_env, work, timeout=300)
                with open(out) as f:
                    figures = json.load(f)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                results.take("launch", n, fw, {"error": str(exc)})
                continue
            results.add("launch", n, fw, {"first_step_s": figures["first_step_s"]})
            if n == 1:
                results.add("import", 1, fw, {k: figures[k] for k in ("torch_s", "over_torch_s")})

    for rep in range(plan.reps):
        each(rotated(frameworks, rep), lambda fw, rep=rep: one(fw, rep), plan.quick)


# A crash trial whose save ends before the kill timer fires (a small checkpoint, a loaded machine) tested nothing:
# it is run again, up to this many times in all.
CRASH_ATTEMPTS = 3


class Correctness:
    """Exact resume (2 processes: a reference launch that saves mid-run, then a fresh launch that resumes) and crash
    safety (1 process: SIGKILLed saves, then a launch that loads each). Each check has launches of its own: an
    `Accelerator` keeps every object prepared in its process, so a check cannot share a launch with other
    scenarios (its checkpoint would hold their models too)."""

    def __init__(self, plan: Plan, work: str) -> None:
        self.plan, self.work = plan, work

    def run(self, results: Results, fw: str) -> None:
        quick, work = self.plan.quick, self.work
        trials, unkilled = tempfile.mkdtemp(prefix=f"crash-{fw}-", dir=work), 0
        for i, frac in enumerate(self.plan.crash_fractions):
            trial = os.path.join(trials, f"trial{i}")
            for _ in range(CRASH_ATTEMPTS):
                shutil.rmtree(trial, ignore_errors=True)
                os.makedirs(trial)
                killed = worker(fw, 1, "crash", quick, work, phase="kill", dir=trial, frac=frac)
                if killed.get("crash", {}).get("killed") is not False:
                    break
            else:  # every attempt's save finished before the timer: that trial tested nothing
                unkilled += 1
        verdict = worker(fw, 1, "crash", quick, work, phase="verify", dir=trials)["crash"]
        if unkilled:
            verdict["unkilled_trials"] = unkilled
        results.take("crash", 1, fw, verdict)
        if unkilled and "error" not in verdict:
            results.note("crash", 1, fw, f"{unkilled} trial(s) never killed: each save ended before the timer")
        folder = tempfile.mkdtemp(prefix=f"resume-{fw}-", dir=work)
        reference = worker(fw, 2, "resume", quick, work, phase="reference", dir=folder)["resume"]
        if "error" in reference:
            results.take("resume", 2, fw, reference)
            return
        results.take("resume", 2, fw, worker(fw, 2, "resume", quick, work, phase="resume", dir=folder)["resume"])


def in_process(
    results: Results,
    frameworks: list[str],
    plan: Plan,
    work: str,
    ckpt_dir: str | None,
) -> None:
    """Step time, loader, gather (1 and 2 processes) per repetition, checkpoint I/O (1 process) in the first
    `checkpoint_reps`."""
    extra = {"checkpoint.dir": ckpt_dir} if ckpt_dir else {}

    def one(fw: str, rep: int) -> None:
        for procs in (1, 2):
            scenarios = ["step", "loader", "gather"]
            options: dict[str, str] = {}
            if procs == 1 and rep < plan.checkpoint_reps:
                scenarios.append("checkpoint")
                options.update(extra)
            for name, figures in worker(fw, procs, ",".join(scenarios), plan.quick, work, **options).items():
                results.take(name, procs, fw, figures)

    for rep in range(plan.reps):
        each(rotated(frameworks, rep), lambda fw, rep=rep: one(fw, rep), plan.quick)


def sharded(results: Results, frameworks: list[str], plan: Plan, work: str) -> None:
    """FSDP2 and ZeRO-3 on 2 processes, `sharded_reps` rotated launches per framework and strategy: bytes held
    (exact), step time (median over the launches). Its own phase, so that it can be measured again alone
    (`--phases sharded`) keeping the other figures."""

    def one(fw: str) -> None:
        for strategy in ("fsdp2", "zero3"):
            figures = worker(fw, 2, "sharded", plan.quick, work, strategy=strategy)["sharded"]
            results.take(strategy, 2, fw, figures)
            if figures.get("param_fraction", 0) > 0.99:
                results.note(strategy, 2, fw, "ran, but did not shard (data parallel: every process holds all)")

    for rep in range(plan.sharded_reps):
        each(rotated(frameworks, rep), one, plan.quick)


def readmes(out: Path) -> dict[str, Path]:
    """The READMEs whose tables a full run rewrites: the one in `out`, and the root README when `out` is the
    repository's bench/results."""
    found = {"results": out / "README.md"}
    if out.resolve() == RESULTS.resolve():
        found["summary"] = HERE.parent.parent / "README.md"
    return found


def merge(paths: list[Path], out: Path) -> None:
    """One table from runs of separate phases (e.g. correctness run apart from the timings)."""
    import report

    results, metas, frameworks = Results(), [], []
    for path in paths:
        data = json.loads(path.read_text())
        results.restore(data, keep=None)
        metas.append(data["meta"])
        frameworks += [fw for fw in data["frameworks"] if fw not in frameworks]
    runs = [run for m in metas for run in m.get("runs", [m])]  # a merged JSON brings its own runs
    meta = {**metas[0], "phases": [p for r in runs for p in r["phases"]], "runs": runs}
    meta["load_at_end"] = max(m["load_at_end"] for m in metas)
    print(report.write(results, meta, [fw for fw in FRAMEWORKS if fw in frameworks], out, readmes(out)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="CI smoke: every scenario once, tiny sizes, forked launches (< 3 min)"
    )
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma-separated subset")
    parser.add_argument("--reps", type=int, default=None, help="launches per framework and scenario (default 5)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for JSON, table and charts")
    parser.add_argument("--ckpt-dir", default=None, help="where checkpoints are written (default: temp folder)")
    parser.add_argument("--no-install", action="store_true", help="skip peers whose environment is missing")
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help="subset to run; the other phases' figures are kept from an earlier run's JSON in --out",
    )
    parser.add_argument(
        "--merge", nargs="+", default=None, help="JSON files of runs of different phases: writes their union to --out"
    )
    args = parser.parse_args()
    if args.merge:
        merge([Path(p) for p in args.merge], Path(args.out))
        return
    plan = Plan(args.quick, args.reps)
    phases = args.phases.split(",")
    frameworks = []
    for fw in args.frameworks.split(","):
        if envs.prepare(fw, create=not args.no_install):
            frameworks.append(fw)
    started, cpu_started = time.time(), cpu_seconds()
    results = Results()
    timings: dict[str, dict[str, float]] = {}
    global ZYGOTES
    with tempfile.TemporaryDirectory(prefix="accel-compare-") as work:
        ZYGOTES = Zygotes(envs.python, clean_env, work) if plan.quick else None
        try:
            checks = Correctness(plan, work)
            steps = (
                ("startup", "startup", lambda: startup(results, frameworks, plan, work)),
                ("in-process", "in-process", lambda: in_process(results, frameworks, plan, work, args.ckpt_dir)),
                ("sharded", "sharded", lambda: sharded(results, frameworks, plan, work)),
                (
                    "correctness",
                    "correctness",
                    lambda: each(frameworks, lambda fw: checks.run(results, fw), plan.quick),
                ),
            )
            for phase, label, step in steps:
                if phase not in phases:
                    continue
                t0, c0 = time.time(), cpu_seconds()
                step()
                timings[label] = {"wall_s": round(time.time() - t0, 1), "cpu_s": round(cpu_seconds() - c0, 1)}
                print(
                    f"{label}: {timings[label]['wall_s']:.0f} s wall, {timings[label]['cpu_s']:.0f} s CPU", flush=True
                )
        finally:  # on an error or Ctrl-C too: a zygote kills the children it has left, then exits
            if ZYGOTES is not None:
                for fw, zygote in ZYGOTES.started.items():
                    LAUNCHES.append(("zygote start", fw, zygote.start_s, zygote.start_cpu))
                ZYGOTES.close()
                ZYGOTES = None
    # Read only now, so that a run of the other phases started alongside this one has written its figures.
    earlier = Path(args.out) / ("compare-quick.json" if args.quick else "compare.json")
    if set(phases) != set(PHASES) and earlier.exists():
        kept = [scenario for phase in PHASES if phase not in phases for scenario in PHASES[phase]]
        results.restore(json.loads(earlier.read_text()), keep=kept)

    import report

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "quick": args.quick,
        "reps": plan.reps,
        "in_process_reps": plan.reps,
        "checkpoint_reps": plan.checkpoint_reps,
        "phases": phases,
        "cpus": os.cpu_count(),
        "load_at_end": os.getloadavg()[0],
        "seconds": round(time.time() - started),
        "cpu_seconds": round(cpu_seconds() - cpu_started),
        "phase_timings": timings,
        "launches": launch_costs(),
        "versions": {fw: envs.versions(fw) for fw in frameworks},
    }
    summary = report.write(results, meta, frameworks, Path(args.out), readmes(Path(args.out)))
    print(summary)
    if results.errors:
        print("\nscenarios that errored:\n" + "\n".join(results.errors), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
