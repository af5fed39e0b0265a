"""The local tracker, the base class, the plot and progress helpers, and the light import."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import accel_tracking
from accel_tracking import GeneralTracker, LoggerType
from accel_tracking.base import flatten_dict, require, resolve_logging_dir


def test_import_is_light_and_names_are_lazy() -> None:
    code = textwrap.dedent(
        """
        import sys, accel_tracking
        heavy = ("torch", "wandb", "mlflow", "tensorboard", "tqdm", "matplotlib", "comet_ml")
        heavy = [m for m in heavy if m in sys.modules]
        assert not heavy, heavy
        assert accel_tracking.LocalTracker.__name__ == "LocalTracker"
        assert "torch" not in sys.modules
        assert sorted(accel_tracking.__all__) == sorted(set(accel_tracking.__all__))
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_logger_type_is_the_entry_point_name() -> None:
    from accel_core import discovery

    assert str(LoggerType.TENSORBOARD) == "tensorboard" and LoggerType.COMETML == "comet_ml"
    registered = set(discovery.available("accel.trackers"))
    # The reference's names for trackers accel does not ship: members (so comparisons work), no entry point.
    reference_only = {LoggerType.AIM, LoggerType.TRACKIO, LoggerType.CLEARML, LoggerType.DVCLIVE, LoggerType.SWANLAB}
    for member in LoggerType:
        if member is LoggerType.ALL:
            continue
        if member in reference_only:
            assert str(member) not in registered
            with pytest.raises(discovery.MissingPackageError, match=f"'{member}'.*not available"):
                discovery.load("accel.trackers", str(member))
            continue
        assert str(member) in registered
        cls = discovery.load("accel.trackers", str(member))
        assert issubclass(cls, GeneralTracker) and cls.name == str(member)


def test_local_tracker_round_trip(tmp_path: Path) -> None:
    from accel_tracking import LocalTracker, read_config, read_metrics

    tracker = LocalTracker("run1", tmp_path)
    assert tracker.requires_logging_directory and tracker.is_active
    tracker.store_init_configuration({"lr": 1e-3, "model": {"depth": 2}, "path": tmp_path, "betas": (0.9, 0.99)})
    tracker.log({"loss": 1.5, "acc": 0.25, "note": "warmup"}, step=0)
    tracker.log({"loss": 0.75, "nan": float("nan")}, step=10)
    tracker.log({"lr": 5e-4})  # no step
    tracker.log_table("preds", columns=["x", "y"], data=[[1, 2], [3, 4]], step=10)
    tracker.finish()
    tracker.finish()  # idempotent
    with pytest.raises(ValueError, match="finished"):
        tracker.log({"loss": 1.0}, step=11)

    records = read_metrics(tmp_path / "run1")
    assert [r["step"] for r in records] == [0, 10, None]
    assert records[0]["loss"] == 1.5 and records[0]["acc"] == 0.25 and records[0]["note"] == "warmup"
    assert records[1]["loss"] == 0.75 and records[1]["nan"] == "nan"
    assert records[2]["lr"] == 5e-4 and records[2]["time"] >= records[0]["time"]
    assert read_metrics(tmp_path / "run1" / "metrics.jsonl") == records
    config = read_config(tmp_path / "run1")
    assert config == {"lr": 1e-3, "model": {"depth": 2}, "path": str(tmp_path), "betas": [0.9, 0.99]}
    table = json.loads((tmp_path / "run1" / "tables" / "preds_step10.json").read_text())
    assert table == {"columns": ["x", "y"], "data": [[1, 2], [3, 4]], "step": 10}


def test_local_tracker_tensors_types_and_torn_line(tmp_path: Path) -> None:
    import numpy as np
    import torch

    from accel_tracking import LocalTracker, read_metrics

    tracker = LocalTracker("run", tmp_path)
    tracker.log({"loss": torch.tensor(0.5), "n": np.int64(3), "vec": torch.tensor([1.0, 2.0])}, step=np.int64(1))
    with pytest.raises(TypeError, match="dict"):
        tracker.log([1, 2])  # type: ignore[arg-type]  # the wrong type is what the test checks
    tracker.finish()
    # A run killed mid-write leaves a torn last line: the records before it still read.
    with open(tmp_path / "run" / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 2, "loss": 0.')
    records = read_metrics(tmp_path / "run")
    assert records == [{"step": 1, "time": records[0]["time"], "loss": 0.5, "n": 3, "vec": [1.0, 2.0]}]
    # Appending to an existing run keeps what was there (a resumed run continues its curve).
    again = LocalTracker("other", tmp_path)
    again.log({"a": 1}, step=1)
    again.finish()
    again = LocalTracker("other", tmp_path)
    again.log({"a": 2}, step=2)
    again.finish()
    assert [r["a"] for r in read_metrics(tmp_path / "other")] == [1, 2]


def test_metrics_named_step_or_time_are_kept_apart_from_the_trackers_fields(tmp_path: Path) -> None:
    import time

    from accel_tracking import LocalTracker, logged_metrics, plot_metrics, read_metrics
    from accel_tracking.local import logged_name, stored_name

    tracker = LocalTracker("glue", tmp_path)
    before = time.time()
    # transformers' run_glue_no_trainer: log({... "epoch": epoch, "step": completed_steps}, step=completed_steps)
    tracker.log({"accuracy": 0.5, "epoch": 0, "step": 10}, step=10)
    tracker.log({"time": 3.5, "metric:step": 1, "metric:time": "x", "metric:other": 2, "loss": 0.25}, step=20)
    tracker.log({"step": 7})  # no step= argument: the record's step stays None
    tracker.finish()

    records = read_metrics(tmp_path / "glue")
    assert [r["step"] for r in records] == [10, 20, None]  # the tracker's step, as before
    assert all(before <= r["time"] <= time.time() for r in records)  # the tracker's wall-clock time
    assert records[0]["metric:step"] == 10 and records[1]["metric:time"] == 3.5
    assert records[1]["metric:metric:step"] == 1 and records[1]["metric:other"] == 2  # only step/time get a prefix
    assert [logged_metrics(r) for r in records] == [
        {"accuracy": 0.5, "epoch": 0, "step": 10},
        {"time": 3.5, "metric:step": 1, "metric:time": "x", "metric:other": 2, "loss": 0.25},
        {"step": 7},
    ]
    for name in ["step", "time", "metric:step", "metric:metric:time", "metric:", "metric:x", "steps", "loss"]:
        assert logged_name(stored_name(name)) == name
        assert stored_name(name) not in ("step", "time")
    # The rewind of a resumed run reads the tracker's step, not the metric.
    again = LocalTracker("glue", tmp_path)
    again.rewind(10)
    again.finish()
    assert [logged_metrics(r) for r in read_metrics(tmp_path / "glue")] == [
        {"accuracy": 0.5, "epoch": 0, "step": 10},
        {"step": 7},
    ]
    pytest.importorskip("matplotlib")
    png = plot_metrics(tmp_path / "glue", keys=["accuracy", "metric:step"])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_default_logging_dir_is_runs_under_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_tracking import LocalTracker

    monkeypatch.chdir(tmp_path)
    assert resolve_logging_dir(None, "x") == tmp_path / "runs"
    tracker = LocalTracker("r", None)
    tracker.log({"x": 1}, step=0)
    tracker.finish()
    assert (tmp_path / "runs" / "r" / "metrics.jsonl").is_file()
    with pytest.raises(TypeError, match="logging_dir"):
        resolve_logging_dir(3, "local")  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(ValueError, match="run name"):
        LocalTracker("", tmp_path)


def test_missing_library_names_the_extra() -> None:
    with pytest.raises(ImportError, match=r'pip install "accel-tracking\[foo\]"'):
        require("accel_no_such_library_xyz", "foo")
    # A tracker whose library cannot be imported: Python's own `sys.modules[name] = None` block.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["wandb"] = None
        sys.modules["mlflow"] = None
        from accel_tracking import WandBTracker, MLflowTracker
        for cls, extra in ((WandBTracker, "wandb"), (MLflowTracker, "mlflow")):
            try:
                cls("p", None)
            except ImportError as error:
                assert f'pip install "accel-tracking[{extra}]"' in str(error), error
            else:
                raise SystemExit(f"{cls.__name__} did not raise")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_custom_tracker_and_base_defaults(tmp_path: Path) -> None:
    class ListTracker(GeneralTracker):
        name = "list"
        requires_logging_directory = False

        def __init__(self, run_name: str, logging_dir: str | None = None) -> None:
            self.rows: list[tuple[int | None, dict]] = []

        @property
        def tracker(self) -> list:
            return self.rows

        def log(self, values, step=None, **kwargs):
            self.rows.append((step, dict(values)))

    tracker = ListTracker("p")
    tracker.log({"a": 1}, step=3)
    tracker.store_init_configuration({"x": 1})  # the base's no-op
    tracker.finish()
    assert tracker.tracker == [(3, {"a": 1})] and tracker.is_active and "ListTracker" in repr(tracker)
    with pytest.raises(NotImplementedError, match="images"):
        tracker.log_images({"img": None})
    with pytest.raises(NotImplementedError, match="tables"):
        tracker.log_table("t", ["a"], [[1]])
    assert flatten_dict({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a/b": 1, "a/c/d": 2, "e": 3}


def test_progress_bar_on_main_process(capsys: pytest.CaptureFixture[str]) -> None:
    from accel_tracking import progress_bar

    bar = progress_bar(range(5), desc="train", file=sys.stderr)
    assert not bar.disable
    assert list(bar) == [0, 1, 2, 3, 4]
    assert "train" in capsys.readouterr().err
    assert progress_bar(range(3), disable=True).disable


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_metrics_writes_a_png(tmp_path: Path) -> None:
    from matplotlib.image import imread

    from accel_tracking import LocalTracker, plot_metrics

    tracker = LocalTracker("curve", tmp_path)
    for step in range(50):
        tracker.log({"loss": math.exp(-step / 10) + 0.01 * (step % 3), "acc": step / 50}, step=step)
    tracker.log({"note": "done"})
    tracker.finish()

    out = plot_metrics(tmp_path / "curve", keys=["loss"], out_png=tmp_path / "loss.png")
    assert out == tmp_path / "loss.png"
    width, height = _png_size(out)
    assert (width, height) == (700, 260) and out.stat().st_size > 10_000
    pixels = imread(out)
    assert pixels.std() > 0.05  # something was drawn, not a blank canvas

    both = plot_metrics(tmp_path / "curve" / "metrics.jsonl", log_y=True)  # every numeric key
    assert both == tmp_path / "curve" / "metrics.png" and _png_size(both) == (700, 520)
    with pytest.raises(ValueError, match="No numeric values"):
        plot_metrics(tmp_path / "curve", keys=["note"])
    with pytest.raises(FileNotFoundError):
        plot_metrics(tmp_path / "nowhere")


def test_all_names_resolve() -> None:
    from accel_tracking import _LAZY

    assert set(_LAZY) <= set(accel_tracking.__all__)
    for name in accel_tracking.__all__:
        assert getattr(accel_tracking, name) is not None
    with pytest.raises(AttributeError):
        accel_tracking.NoSuchThing


@pytest.mark.parametrize("tracker", ["local", "tensorboard"])
def test_a_logging_dir_that_cannot_be_created_is_named_with_the_fix(tmp_path: Path, tracker: str) -> None:
    """Under a file (and, where this process is not root, in a read-only folder): one ValueError naming the folder."""
    from accel_core import Accelerator, ProjectConfiguration

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    accelerator = Accelerator(
        cpu=True, log_with=tracker, project_config=ProjectConfiguration(logging_dir=blocker / "logs")
    )
    with pytest.raises(
        ValueError, match=r"cannot create its logging folder .*a_file/logs.*a file is in the way.*logging_dir="
    ):
        accelerator.init_trackers("run")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_logging_dir_is_named_with_the_fix(tmp_path: Path) -> None:
    from accel_tracking import LocalTracker

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(ValueError, match=r"cannot create its logging folder .*locked/logs.*Permission denied"):
            LocalTracker("run", locked / "logs")
    finally:
        locked.chmod(0o700)
