"""A job whose workers are SIGKILLed three times restarts, resumes by itself and ends bit-identical.

``restartable_train.py`` runs on 2 CPU processes under ``accel launch --auto-resume --max-restarts 3``
with a periodic save every 3 optimizer steps, gradient accumulation, a shuffled prepared loader,
dropout, an LR scheduler and the local and TensorBoard trackers. In each of the first three
attempts one worker (rank and step drawn at random; the last kill inside a save, after its hidden
folder exists) SIGKILLs itself; torchrun's agent restarts both workers and the Accelerator resumes
from the newest complete checkpoint. An uninterrupted run of the same script is the reference.

The same job in other launch configurations is the CI subset of the restart matrix
(``restart_matrix.py``, the whole matrix by hand): a fixed ``--main-process-port``, the static
rendezvous of two nodes on the loopback, a kill inside a collective or while DataLoader workers load,
and FSDP2, each value at least once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import processes  # tests/harness: ends the launcher's whole tree on a timeout
import pytest
import torch
from safetensors.torch import load_file

from accel_tracking.local import read_metrics

HERE = Path(__file__).resolve().parent


def _import_matrix():
    """restart_matrix.py, a script run by hand: pytest imports the tests by path, not this folder's modules."""
    spec = importlib.util.spec_from_file_location("restart_matrix", HERE / "restart_matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


matrix = _import_matrix()
SCRIPT = HERE / "restartable_train.py"
STEPS = 16  # 64 samples / (2 processes x 4) = 8 micro-batches per epoch, 2 per step, 4 epochs
SAVE_EVERY = 3


def _accel() -> list[str]:
    script = Path(sys.executable).parent / "accel"
    return [str(script)] if script.exists() else [sys.executable, "-m", "accel.cli"]


def _launch(
    project: Path,
    plan: dict[str, list[object]] | None,
    restarts: int,
    sigterm_checkpoint: bool = False,
) -> subprocess.CompletedProcess[str]:
    project.mkdir(exist_ok=True)
    # SIGKILL loses a process, not the page cache: fsync would only slow the 9 saves down.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCEL_CHECKPOINT_FSYNC": "0", "FAULT_PLAN": json.dumps(plan or {})}
    env["CHECKPOINT_ON_SIGTERM"] = "1" if sigterm_checkpoint else "0"
    command = [*_accel(), "launch", "--cpu", "-n", "2", "--max-restarts", str(restarts), "--auto-resume"]
    return processes.run([*command, str(SCRIPT), str(project)], env, timeout=900)


def _fault_plan(rng: random.Random) -> dict[str, list[object]]:
    """Three kills at increasing steps, each attempt getting past the last one; the last inside a save."""
    first = rng.randint(2, 5)
    second = rng.randint(first + 1, 9)
    saves = [s for s in range(second + 1, STEPS) if s % SAVE_EVERY == 0]
    third = rng.choice(saves)
    return {
        "0": [rng.randint(0, 1), first, "step"],
        "1": [rng.randint(0, 1), second, "step"],
        "2": [rng.randint(0, 1), third, "save"],
    }


def _tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """What TensorBoard shows: its loader applies the restart markers (purge_step) of later event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


@pytest.fixture(scope="module")
def reference(restartable_reference: Path) -> Path:
    """An uninterrupted run of the script (tests/faults/conftest.py): its final weights and metrics are what every
    faulty run must end with."""
    return restartable_reference


def _assert_same_end(project: Path, reference: Path, why: str) -> None:
    """Bit-identical final weights; each step logged once with the reference's values (local and TensorBoard)."""
    expected = load_file(reference / "final.safetensors")
    got = load_file(project / "final.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs ({why})"
    reference_metrics = read_metrics(reference / "run")
    metrics = read_metrics(project / "run")
    assert [r["step"] for r in reference_metrics] == list(range(1, STEPS + 1))
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1)), why
    for ours, theirs in zip(metrics, reference_metrics, strict=True):
        assert (ours["loss"], ours["lr"], ours["epoch"]) == (theirs["loss"], theirs["lr"], theirs["epoch"]), why
    for tag in ("loss", "lr"):
        assert _tensorboard_scalars(project / "run", tag) == _tensorboard_scalars(reference / "run", tag), why


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_saves_an_emergency_checkpoint_and_the_next_launch_continues_exactly(
    tmp_path: Path, reference: Path
) -> None:
    """checkpoint_on_sigterm, twice in one project: SIGTERM to one worker only (the ranks must agree), then, in the
    launch that resumed from that, to the launcher (a cluster's preemption notice, forwarded by torchrun's agent).
    Each ends the job with 143 after every rank saved the current step; the next launch with --auto-resume continues
    from exactly there, and the third ends as the uninterrupted run. (One project for both signals: three launches,
    not two of two each.)"""
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    steps = [s for s in range(2, STEPS - 1) if s % SAVE_EVERY]  # not a periodic save's step
    to_worker = rng.choice(steps[:-1])
    to_launcher = rng.choice([s for s in steps if s > to_worker])  # reached after the resume from the first
    plans = [
        {"0": [rng.randint(0, 1), to_worker, "sigterm"]},
        {"0": [rng.randint(0, 1), to_launcher, "sigterm-launcher"]},
    ]
    why = f"seed {seed}, plans {plans}"
    project = tmp_path / "preempted"

    for plan in plans:
        stopped = _launch(project, plan, restarts=0, sigterm_checkpoint=True)
        assert stopped.returncode == 143, f"{why}\n{stopped.stdout}\n{stopped.stderr}"
        assert not (project / "final.safetensors").exists(), why
    last = _launch(project, None, restarts=0, sigterm_checkpoint=True)
    assert last.returncode == 0, f"{why}\n{last.stdout}\n{last.stderr}"

    attempts = [json.loads(line) for line in (project / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 6 and [a["resumed_from"] is None for a in attempts[:2]] == [True, True], (why, attempts)
    for launch, resumed in (("second", attempts[2:4]), ("third", attempts[4:])):
        assert all(a["resumed_from"] is not None for a in resumed) and {a["rank"] for a in resumed} == {0, 1}, (
            launch,
            why,
            attempts,
        )
        assert resumed[0]["completed_steps"] == resumed[1]["completed_steps"], (launch, why, attempts)  # the same one
    # SIGTERM to a worker arrives before the step's boundary: saved exactly there.
    assert attempts[2]["completed_steps"] == to_worker, (why, attempts)
    # Forwarded by the launcher's agent: at that boundary or a later one, never a periodic checkpoint.
    assert attempts[4]["completed_steps"] >= to_launcher, (why, attempts)
    _assert_same_end(project, reference, why)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigkilled_workers_restart_and_resume_bit_identically(tmp_path: Path, reference: Path) -> None:
    """The restart matrix's cell own-port/c10d/step+save/ddp, three times in one job (two kills in a step, one
    in a save); the other launch configurations are the cells of the test below."""
    seed = random.SystemRandom().randrange(2**32)
    plan = _fault_plan(random.Random(seed))
    why = f"seed {seed}, plan {plan}"
    shutil.copytree(reference, tmp_path / "reference")
    faulty = _launch(tmp_path / "faulty", plan, restarts=3)
    assert faulty.returncode == 0, f"{why}\n{faulty.stdout}\n{faulty.stderr}"

    # Each of the first three attempts lost a worker to SIGKILL; the fourth finished.
    attempts = [json.loads(line) for line in (tmp_path / "faulty" / "attempts.jsonl").read_text().splitlines()]
    assert sorted({a["attempt"] for a in attempts}) == [0, 1, 2, 3], why
    resumed = {a["attempt"]: a for a in attempts if a["rank"] == 0}
    assert resumed[0]["resumed_from"] is None
    # A kill right after step s comes before that step's save (taken when the next batch is asked
    # for); a kill inside the save of step s leaves it unfinished: either way the newest checkpoint
    # is the last multiple of SAVE_EVERY before s (none: a fresh start).
    expected_resume = {attempt: (plan[str(attempt - 1)][1] - 1) // SAVE_EVERY * SAVE_EVERY for attempt in (1, 2, 3)}
    for attempt, steps in expected_resume.items():
        assert resumed[attempt]["completed_steps"] == steps, (why, resumed)
        if steps:
            assert resumed[attempt]["resumed_from"].endswith(f"checkpoint_{steps // SAVE_EVERY - 1}"), (why, resumed)
    for a in attempts:  # both ranks agreed on the checkpoint
        assert a["completed_steps"] == resumed[a["attempt"]]["completed_steps"], (why, attempts)

    # Bit-identical final weights.
    expected = load_file(tmp_path / "reference" / "final.safetensors")
    got = load_file(tmp_path / "faulty" / "final.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs ({why})"

    # The metrics continue in the same run: each step once, in order, with the reference's values.
    reference_metrics = read_metrics(tmp_path / "reference" / "run")
    metrics = read_metrics(tmp_path / "faulty" / "run")
    assert [r["step"] for r in reference_metrics] == list(range(1, STEPS + 1))
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1)), why
    for ours, theirs in zip(metrics, reference_metrics, strict=True):
        assert (ours["loss"], ours["lr"], ours["epoch"]) == (theirs["loss"], theirs["lr"], theirs["epoch"]), why
    for tag in ("loss", "lr"):
        assert _tensorboard_scalars(tmp_path / "faulty" / "run", tag) == _tensorboard_scalars(
            tmp_path / "reference" / "run", tag
        ), why
    assert len(list((tmp_path / "faulty" / "run").glob("events.out.tfevents.*"))) >= 4  # one writer per attempt

    # total_limit=2 kept rotating; the killed save left no checkpoint that counts.
    checkpoints = sorted(os.listdir(tmp_path / "faulty" / "checkpoints"))
    assert [c for c in checkpoints if not c.startswith(".")] == ["checkpoint_3", "checkpoint_4"], checkpoints


# The rest of the restart matrix's CI subset (tests/faults/restart_matrix.py runs all of it, by hand): with the
# test above (own port, c10d, kills in a step and in a save, DDP), each value of each column at least once, in two
# more jobs: fixed port + static rendezvous (two nodes on the loopback) with a kill inside a collective, FSDP2; own
# port + c10d with a kill while DataLoader workers load, FSDP2. Cells left to the hand runs, whose values these
# cover: fixed/c10d/collective/fsdp2 (a fixed port with c10d: test_two_nodes.py restarts that configuration, a whole
# node lost) and fixed/static/save/ddp (the static rendezvous restarting a DDP job: test_restart_rendezvous.py).
CI_CELLS = [
    matrix.Cell("fixed", "static", "collective", "fsdp2"),
    matrix.Cell("own", "c10d", "loading", "fsdp2"),
]


@pytest.fixture(scope="module")
def fsdp2_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of the script with FSDP2."""
    project = tmp_path_factory.mktemp("faults") / "reference_fsdp2"
    run = matrix.launch(project, None, None, "fsdp2")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("cell", CI_CELLS, ids=lambda cell: cell.name)
def test_a_sigkilled_worker_restarts_and_resumes_bit_identically_in_each_launch_configuration(
    tmp_path: Path, reference: Path, request: pytest.FixtureRequest, cell: matrix.Cell
) -> None:
    """One SIGKILL at a random step: one restart seen, final weights bit-identical, every step logged once."""
    baseline = reference if cell.strategy == "ddp" else request.getfixturevalue("fsdp2_reference")
    seed = random.SystemRandom().randrange(2**32)
    result, attempts, seconds, detail = matrix.run_cell(cell, baseline, tmp_path, random.Random(seed))
    assert result == "passed", (
        f"{cell.name}: {result} after {attempts} attempt(s), {seconds:.0f} s (seed {seed}): {detail}"
    )
