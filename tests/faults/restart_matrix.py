"""The restart matrix of issue 27, run by hand: every launch configuration must survive a SIGKILLed worker.

    python tests/faults/restart_matrix.py [--cells PATTERN ...] [--seed N]

Cells: {torchrun's own port, a fixed ``--main-process-port``} x {c10d, static rendezvous} x {a kill
during a step, during a save, during a collective, while DataLoader workers load} x {DDP, FSDP2}.
Each cell runs ``restartable_train.py`` on 2 CPU processes under ``accel launch --auto-resume
--max-restarts 1`` with one SIGKILL (rank and step drawn at random) and passes when the job finishes
after exactly one restart with final weights bit-identical to an uninterrupted run of the same
strategy and every step logged once with the reference's values. Prints one line per cell, then the
table. tests/faults/test_auto_resume.py runs a subset in CI (each row and each column value once).

How each rendezvous is reached on one machine (accel_launch.plan): ``accel launch`` without a port
lets torchrun pick one (its standalone c10d rendezvous); with ``--main-process-port`` it uses c10d on
that port. The static rendezvous is torchrun's for several machines: reached here as two nodes of one
process each on 127.0.0.1 (``--num-machines 2 --machine-rank {0,1} --rdzv-backend static``; with
restarts several machines default to c10d, and ``accel launch`` warns that a lost machine could not
rejoin a static one: here only a worker is lost). One machine with ``--rdzv-backend static`` still
gets c10d (accel_launch.rendezvous says why). It always has a fixed port (``--main-process-port``, or
29500): static x torchrun's own port cannot exist, and the table says so.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "harness"))  # run by hand too (pytest's pythonpath has it already)
import processes  # noqa: E402
from nodes import accel_command, free_port  # noqa: E402  # the two-node tests' own helpers

SCRIPT = HERE / "restartable_train.py"
STEPS = 16  # 64 samples / (2 processes x 4) = 8 micro-batches per epoch, 2 per step, 4 epochs
SAVE_EVERY = 3
KILLS = ("step", "save", "collective", "loading")


@dataclass(frozen=True)
class Cell:
    port: str  # "own" (torchrun's) or "fixed" (--main-process-port)
    rendezvous: str  # "c10d" or "static"
    kill: str  # one of KILLS
    strategy: str  # "ddp" or "fsdp2"

    @property
    def name(self) -> str:
        return f"{self.port}-port/{self.rendezvous}/{self.kill}/{self.strategy}"

    def impossible(self) -> str | None:
        """Why this cell cannot exist, or None."""
        if self.rendezvous == "static" and self.port == "own":
            return "the static rendezvous needs a port every node knows in advance (accel launch: 29500 by default)"
        return None


def all_cells() -> list[Cell]:
    return [
        Cell(*values) for values in itertools.product(("own", "fixed"), ("c10d", "static"), KILLS, ("ddp", "fsdp2"))
    ]


def fault_plan(kill: str, rng: random.Random) -> dict[str, list[object]]:
    """One kill in the first attempt at a random step (a save's step for a save; for the loading kill a
    step before the last epoch, so that a worker loads again after it)."""
    if kill == "save":
        step = rng.choice([s for s in range(SAVE_EVERY, STEPS) if s % SAVE_EVERY == 0])
    else:
        step = rng.randint(2, 11 if kill == "loading" else STEPS - 1)
    return {"0": [rng.randint(0, 1), step, kill]}


def launch(
    project: Path, cell: Cell | None, plan: dict[str, list[object]] | None, strategy: str, timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    """Runs the job of ``cell`` (None: the uninterrupted reference, own port) on 2 processes."""
    project.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCEL_CHECKPOINT_FSYNC": "0", "FAULT_PLAN": json.dumps(plan or {})}
    env["LOADER_WORKERS"] = "2" if cell is not None and cell.kill == "loading" else "0"
    restarts = "1" if cell is not None else "0"
    base = [*accel_command(), "launch", "--cpu", "--max-restarts", restarts, "--auto-resume"]
    if strategy == "fsdp2":
        base.append("--use-fsdp")
    tail = [str(SCRIPT), str(project)]
    if cell is None or cell.rendezvous == "c10d":
        port = ["--main-process-port", str(free_port())] if cell is not None and cell.port == "fixed" else []
        return processes.run([*base, "-n", "2", *port, *tail], env, timeout)
    # static: two nodes of one process each on the loopback.
    nodes = ["--num-machines", "2", "--main-process-ip", "127.0.0.1", "--main-process-port", str(free_port())]
    nodes += ["--rdzv-backend", "static"]  # several machines with restarts default to c10d
    agents = [
        subprocess.Popen(
            [*base, "-n", "2", *nodes, "--machine-rank", str(node), *tail],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for node in (0, 1)
    ]
    outputs = []
    for agent in agents:
        try:
            out, err = agent.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in agents:
                processes.kill_tree(other.pid)
            out, err = agent.communicate()
        outputs.append((agent.returncode, out, err))
    code = next((c for c, _, _ in outputs if c != 0), 0)
    return subprocess.CompletedProcess(
        agents[0].args, code, "".join(o for _, o, _ in outputs), "".join(e for _, _, e in outputs)
    )


def compare(project: Path, reference: Path) -> str | None:
    """None when bit-identical with every step logged once with the reference's values, else what differs."""
    import torch
    from safetensors.torch import load_file

    from accel_tracking.local import read_metrics

    if not (project / "final.safetensors").exists():
        return "no final weights"
    expected, got = load_file(reference / "final.safetensors"), load_file(project / "final.safetensors")
    if expected.keys() != got.keys():
        return f"weights {sorted(got)} vs {sorted(expected)}"
    differing = [name for name in expected if not torch.equal(expected[name], got[name])]
    if differing:
        return f"weights differ: {', '.join(differing)}"
    ours, theirs = read_metrics(project / "run"), read_metrics(reference / "run")
    if [r["step"] for r in ours] != list(range(1, STEPS + 1)):
        return f"steps logged: {[r['step'] for r in ours]}"
    for mine, reference_row in zip(ours, theirs, strict=True):
        if (mine["loss"], mine["lr"], mine["epoch"]) != (
            reference_row["loss"],
            reference_row["lr"],
            reference_row["epoch"],
        ):
            return f"metrics of step {mine['step']} differ"
    return None


def attempts_seen(project: Path) -> int:
    path = project / "attempts.jsonl"
    if not path.exists():
        return 0
    return len({json.loads(line)["attempt"] for line in path.read_text().splitlines()})


def run_cell(cell: Cell, reference: Path, work: Path, rng: random.Random) -> tuple[str, int, float, str]:
    """(result, attempts seen, seconds, detail) of one cell."""
    why = cell.impossible()
    if why is not None:
        return "cannot exist", 0, 0.0, why
    plan = fault_plan(cell.kill, rng)
    project = work / cell.name.replace("/", "_")
    start = time.monotonic()
    run = launch(project, cell, plan, cell.strategy)
    elapsed = time.monotonic() - start
    attempts = attempts_seen(project)
    if run.returncode != 0:
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        return "FAILED", attempts, elapsed, f"plan {plan}: exit {run.returncode}: {' | '.join(tail)}"
    if attempts != 2:
        return "FAILED", attempts, elapsed, f"plan {plan}: {attempts} attempt(s), expected 2 (one restart)"
    differs = compare(project, reference)
    if differs:
        return "FAILED", attempts, elapsed, f"plan {plan}: {differs}"
    return "passed", attempts, elapsed, f"plan {plan}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="*", default=["*"], help="glob patterns over cell names, e.g. '*/static/*'")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the runs, a new one (default: a temporary one)"
    )
    parser.add_argument("--references", type=Path, default=None, help="a --work of an earlier run: its references")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    # In the order of the patterns (the cells of the first pattern first), each cell once.
    cells = list(dict.fromkeys(c for p in args.cells for c in all_cells() if fnmatch.fnmatch(c.name, p)))
    work = args.work or Path(tempfile.mkdtemp(prefix="restart_matrix_"))
    print(f"seed {seed}, {len(cells)} cell(s), runs under {work}", flush=True)
    references: dict[str, Path] = {}
    rows = []
    for cell in cells:
        if cell.strategy not in references and cell.impossible() is None:
            reference = (args.references or work) / f"reference_{cell.strategy}"
            # A finished reference (from --references) is reused: the same script and settings.
            run = None if (reference / "final.safetensors").exists() else launch(reference, None, None, cell.strategy)
            if run is not None and run.returncode != 0:
                print(f"reference {cell.strategy} failed:\n{run.stdout}\n{run.stderr}", flush=True)
                return 2
            references[cell.strategy] = reference
        result, attempts, seconds, detail = run_cell(cell, references.get(cell.strategy, work), work, rng)
        rows.append((cell.name, result, attempts, seconds, detail))
        print(f"{cell.name:36} {result:12} attempts {attempts}  {seconds:6.0f} s  {detail}", flush=True)
    print("\n| cell | result | attempts | time | detail |\n|---|---|---|---|---|")
    for name, result, attempts, seconds, detail in rows:
        print(f"| {name} | {result} | {attempts} | {seconds:.0f} s | {detail} |")
    return 0 if all(r[1] in ("passed", "cannot exist") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
