"""Two real processes (torchrun, gloo, CPU): the trackers write one set of logs, from rank 0."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from checkrun import CheckRun, checks_in

from accel_tracking import read_config, read_metrics

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "tracking_two_process.py"


def _event_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("events.out.tfevents.*"))


@pytest.fixture(scope="module")
def two_process_launch(
    tmp_path_factory: pytest.TempPathFactory, torchrun_checks: Callable[..., CheckRun]
) -> tuple[Path, CheckRun]:
    """One torchrun launch for every check below (trackers direct, via the Accelerator, the example)."""
    tmp = tmp_path_factory.mktemp("two_process")
    wandb_dir = tmp / "wandb_home"
    wandb_dir.mkdir()
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(wandb_dir / "config"),
        "WANDB_CACHE_DIR": str(wandb_dir / "cache"),
    }
    project = tmp / "project"
    launch = torchrun_checks(
        SCRIPT, str(tmp / "out"), "--project-dir", str(project), "--epochs", "3", "--tensorboard", env=env, timeout=240
    )
    return tmp, launch


@pytest.fixture(scope="module")
def two_process_run(two_process_launch: tuple[Path, CheckRun]) -> tuple[Path, Path, str]:
    """The launch's folder, its example's project folder and its output, once every check passed."""
    tmp, launch = two_process_launch
    for name in launch.names:
        launch.assert_passed(name)
    return tmp, tmp / "project", launch.stdout


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_two_process_checks(two_process_launch: tuple[Path, CheckRun], name: str) -> None:
    two_process_launch[1].assert_passed(name)


def test_only_rank0_writes(two_process_run: tuple[Path, Path, str]) -> None:
    tmp, _, _ = two_process_run
    wandb_dir = tmp / "wandb_home"
    out = tmp / "out"

    # Part 1: trackers built on both ranks.
    records = read_metrics(out / "direct" / "direct_local")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4] and {r["rank"] for r in records} == {0}
    assert read_config(out / "direct" / "direct_local") == {"lr": 0.1, "world": 2}
    assert len(_event_files(out / "direct" / "direct_tb")) == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "direct" / "direct_tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [0, 1, 2, 3, 4]
    assert {e.value for e in acc.Scalars("rank")} == {0.0}
    runs = list((wandb_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs  # one W&B run, not one per rank
    sys.path.insert(0, str(HERE))
    import tracking_wandb_reader as wandb_reader

    history = [r for r in wandb_reader.history(next(runs[0].glob("run-*.wandb"))) if "loss" in r]
    assert [r["_step"] for r in history] == [0, 1, 2, 3, 4] and {r["rank"] for r in history} == {0}
    # The opt-out custom tracker wrote on both ranks; the guarded one on rank 0 only.
    per_rank = sorted(p.name for p in (out / "direct").glob("per_rank_rank*.jsonl"))
    assert per_rank == ["per_rank_rank0.jsonl", "per_rank_rank1.jsonl"]
    rank1_rows = [json.loads(line) for line in (out / "direct" / "per_rank_rank1.jsonl").read_text().splitlines()]
    assert {row["rank"] for row in rank1_rows} == {1} and len(rank1_rows) == 5
    assert [p.name for p in (out / "direct").glob("main_only_rank*.jsonl")] == ["main_only_rank0.jsonl"]

    # Part 2: through Accelerator(log_with=[...]).
    records = read_metrics(out / "acc" / "acc_run")
    assert [r["step"] for r in records] == [0, 1, 2, 3] and {r["rank"] for r in records} == {0}
    assert read_config(out / "acc" / "acc_run") == {"lr": 0.1, "world": 2}
    assert len(_event_files(out / "acc" / "acc_run")) == 1
    assert [p.name for p in (out / "acc").glob("acc_custom_rank*.jsonl")] == ["acc_custom_rank0.jsonl"]


def test_example_two_processes_one_log_and_a_png(two_process_run: tuple[Path, Path, str]) -> None:
    _, project, stdout = two_process_run
    run_dir = project / "sine"
    records = read_metrics(run_dir)
    # 1024 samples, 2 processes x 32 per batch -> 16 steps an epoch; logged once, not once per rank.
    assert [r["step"] for r in records] == list(range(48)), stdout
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses  # it learned
    config = read_config(run_dir)
    assert config["num_processes"] == 2 and config["epochs"] == 3
    assert len(_event_files(run_dir)) == 1
    png = run_dir / "loss.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "48 steps logged" in stdout
    # Everything under the project is one run's files: nothing written per rank.
    assert sorted(p.name for p in project.iterdir()) == ["sine"]
    files = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("events"))
    assert files == ["config.json", "loss.png", "metrics.jsonl"]
