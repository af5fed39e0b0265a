"""Run under torchrun with 2 processes: trackers write once, from rank 0 only.

Part 1 uses the trackers directly on every rank (as a user script may), with PartialState.
Part 2 drives them through ``Accelerator(log_with=[...])``. Part 3 runs examples/tracking_local.py
in the same processes (one launch instead of two: each costs seconds of torch import).
The pytest side counts the files; each ``@check`` here is one test of test_tracking_multiprocess.py
(the harness: tests/harness/checklist.py).
Usage: tracking_two_process.py <out_dir> [example args...]   (WANDB_MODE=offline, WANDB_DIR set by the caller)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from checklist import check, expect, run_checks

from accel_core.state import PartialState
from accel_tracking import (
    GeneralTracker,
    LocalTracker,
    TensorBoardTracker,
    WandBTracker,
    is_main_process,
    logged_metrics,
    progress_bar,
    read_metrics,
)


class PerRankTracker(GeneralTracker):
    """Writes one file per rank: ``main_process_only = False`` opts out of the guard."""

    name = "per_rank"
    requires_logging_directory = True
    main_process_only = False

    def __init__(self, run_name: str, logging_dir: str) -> None:
        self.path = Path(logging_dir) / f"{run_name}_rank{PartialState().process_index}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []

    @property
    def tracker(self) -> list[dict[str, Any]]:
        return self.rows

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.rows.append({"step": step, **values})

    def finish(self) -> None:
        self.path.write_text("\n".join(json.dumps(r) for r in self.rows))


class MainOnlyCustom(PerRankTracker):
    """The same custom tracker with the default guard: only rank 0 builds and writes it."""

    name = "main_only"
    main_process_only = True


OUT = Path(sys.argv[1])
state = PartialState(cpu=True)
rank = state.process_index


@check
def two_processes_and_rank_0_is_main() -> None:
    expect(state.num_processes == 2, "expected 2 processes")
    expect(is_main_process() == (rank == 0), "is_main_process disagrees with PartialState")


@check
def trackers_built_on_every_rank_are_active_on_rank_0_only() -> None:
    out = OUT
    trackers = [
        LocalTracker("direct_local", out / "direct"),
        TensorBoardTracker("direct_tb", out / "direct"),
        WandBTracker("accel-mp", None, name="direct"),
        PerRankTracker("per_rank", str(out / "direct")),
        MainOnlyCustom("main_only", str(out / "direct")),
    ]
    for tracker in trackers:
        active = tracker.is_active
        expect(active == (rank == 0 or not tracker.main_process_only), f"{tracker.name} active={active}")
        if not active:
            expect(tracker.tracker is None, f"{tracker.name} built a backend object on rank {rank}")
    for tracker in trackers:
        tracker.store_init_configuration({"lr": 0.1, "world": state.num_processes})
    for step in progress_bar(range(5), desc="direct"):
        for tracker in trackers:
            tracker.log({"loss": 1.0 / (step + 1), "rank": rank}, step=step)
    for tracker in trackers:
        tracker.finish()
    bar = progress_bar(range(2))
    expect(bar.disable == (rank != 0), f"progress bar disable={bar.disable} on rank {rank}")
    bar.close()
    everywhere = progress_bar(range(2), main_process_only=False)
    expect(not everywhere.disable and f"rank {rank}" in everywhere.desc, "main_process_only=False bar")
    everywhere.close()
    state.wait_for_everyone()


@check
def accelerator_trackers_are_real_on_rank_0_and_inert_elsewhere() -> None:
    from accel_core.accelerator import Accelerator

    out = OUT
    custom = MainOnlyCustom("acc_custom", str(out / "acc"))
    accelerator = Accelerator(cpu=True, log_with=["local", "tensorboard", custom], project_dir=out / "acc")
    accelerator.init_trackers(
        "acc_run",
        config={"lr": 0.1, "world": accelerator.num_processes},
        init_kwargs={"tensorboard": {"flush_secs": 1}},
    )
    for step in range(4):
        accelerator.log({"loss": 2.0 / (step + 1), "rank": rank}, step=step, log_kwargs={"local": {}})
    local = accelerator.get_tracker("local")
    writer = accelerator.get_tracker("tensorboard", unwrap=True)
    if rank == 0:
        expect(isinstance(local, LocalTracker) and local.is_active, "rank 0 get_tracker('local')")
        expect(type(writer).__name__ == "SummaryWriter", f"unwrap gave {type(writer).__name__}")
        expect(accelerator.get_tracker("main_only") is custom and len(custom.rows) == 4, "custom tracker rows")
    else:
        # As in the reference API, rank 1 gets an inert stand-in (unwrap or not) whose calls do nothing.
        expect(local.tracker is None and writer.tracker is None, "rank 1 must get an inactive tracker")
        local.log({"loss": 123.0}, step=99)
        local.log_table("rows", columns=["a"], data=[[1]])
        local.finish()
        try:
            local.lgo({"loss": 1.0})  # a typo raises here as on the main process, instead of silently doing nothing
            expect(False, "rank 1's stand-in accepted a misspelt method")
        except AttributeError:
            pass
        expect(accelerator.trackers == [], "rank 1 started trackers")
    accelerator.end_training()
    accelerator.wait_for_everyone()


class BrokenTracker(MainOnlyCustom):
    """A tracker whose start fails on the main process (a full disk, W&B not logged in, ...)."""

    name = "broken"

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        raise OSError("disk full")


@check
def init_trackers_on_the_main_process_only_runs_no_collective() -> None:
    # What diffusers' train_*.py scripts do (and Accelerate allows): the other ranks never call init_trackers, so it
    # must not wait for them. Before the fix rank 0 waited in a broadcast the others never entered (a hang).
    from accel_core.accelerator import Accelerator

    out = OUT / "main_only"
    accelerator = Accelerator(cpu=True, log_with=["local"], project_dir=out)
    if accelerator.is_main_process:
        accelerator.init_trackers("diffusers_style", config={"lr": 0.1})
    accelerator.wait_for_everyone()
    for step in range(3):  # a metric named "step", as transformers' no_trainer scripts log
        accelerator.log({"loss": 1.0 / (step + 1), "step": step}, step=step)
    tracker = accelerator.get_tracker("local")
    if rank == 0:
        expect([t.name for t in accelerator.trackers] == ["local"], f"rank 0 trackers {accelerator.trackers}")
        expect(isinstance(tracker, LocalTracker) and tracker.is_active, "rank 0 get_tracker('local')")
    else:
        expect(accelerator.trackers == [] and tracker.tracker is None, "rank 1 has no trackers, an inert stand-in")
    accelerator.end_training()
    accelerator.wait_for_everyone()
    if rank == 0:
        records = read_metrics(out / "diffusers_style")
        expect([r["step"] for r in records] == [0, 1, 2], f"rank 0 logged {records}")
        expect([logged_metrics(r)["step"] for r in records] == [0, 1, 2], f"the step metric: {records}")
    expect(sorted(p.name for p in out.iterdir()) == ["diffusers_style"], "one run folder")

    # A failure on the main process raises there only; the other ranks were not waiting for it.
    failing = Accelerator(cpu=True, log_with=[BrokenTracker("broken", str(out))], project_dir=out)
    raised = ""
    if failing.is_main_process:
        try:
            failing.init_trackers("broken_run", config={"lr": 0.1})
        except OSError as error:
            raised = str(error)
        expect(raised == "disk full", f"rank 0 raised {raised!r}")
    failing.wait_for_everyone()

    # Called on every rank afterwards (a new Accelerator, so its calls are counted afresh): the main process's
    # failure still raises on every rank, without a collective.
    every = Accelerator(cpu=True, log_with=[BrokenTracker("broken", str(out))], project_dir=out)
    try:
        every.init_trackers("broken_everywhere", config={"lr": 0.1})
    except (OSError, RuntimeError) as error:
        raised = str(error)
    expect("disk full" in raised, f"init_trackers failure must raise on every rank, got {raised!r}")
    every.wait_for_everyone()


@check
def the_example_runs_as_a_user_would_run_it() -> None:
    import runpy

    example = runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "tracking_local.py"))
    example["main"](sys.argv[2:])


if __name__ == "__main__":
    run_checks()
