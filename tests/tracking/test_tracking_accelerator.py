"""The trackers driven through core's Accelerator in one process: names, LoggerType, instances, "all"."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from accel_core.configuration import ProjectConfiguration
from accel_tracking import GeneralTracker, LocalTracker, LoggerType, TensorBoardTracker, read_config, read_metrics

sys.path.insert(0, str(Path(__file__).parent))  # pytest runs with --import-mode=importlib
import tracking_wandb_reader as wandb_reader


class RecordingTracker(GeneralTracker):
    """A custom tracker passed as an instance, keeping what it was given."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self) -> None:
        self.config: dict[str, Any] | None = None
        self.calls: list[tuple[int | None, dict[str, Any], dict[str, Any]]] = []
        self.finished = False

    @property
    def tracker(self) -> list:
        return self.calls

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.config = dict(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.calls.append((step, dict(values), kwargs))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    for key in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        (home / key).mkdir(parents=True)
        monkeypatch.setenv(key, str(home / key))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # what CI exports: empty means "the local default"
    monkeypatch.delenv("COMET_OFFLINE_DIRECTORY", raising=False)
    return home


def _accelerator(**kwargs: Any) -> Any:
    from accel_core.accelerator import Accelerator

    return Accelerator(cpu=True, **kwargs)


def test_names_instances_and_kwargs(tmp_path: Path) -> None:
    custom = RecordingTracker()
    accelerator = _accelerator(
        log_with=[LoggerType.LOCAL, "tensorboard", custom],
        project_config=ProjectConfiguration(project_dir=tmp_path / "proj", logging_dir=tmp_path / "logs"),
    )
    accelerator.init_trackers("exp", config={"lr": 0.5, "nested": {"a": 1}}, init_kwargs={"local": {"flush_every": 2}})
    assert [t.name for t in accelerator.trackers] == ["local", "tensorboard", "recording"]
    local = accelerator.get_tracker("local")
    assert isinstance(local, LocalTracker) and local.flush_every == 2  # init_kwargs reached the constructor
    assert type(accelerator.get_tracker("tensorboard", unwrap=True)).__name__ == "SummaryWriter"
    assert accelerator.get_tracker("recording", unwrap=True) is custom.calls
    for step in range(3):
        accelerator.log({"loss": 1.0 - step / 4}, step=step, log_kwargs={"recording": {"commit": step == 2}})
    with pytest.raises(ValueError, match="wandb"):
        accelerator.get_tracker("wandb")
    accelerator.end_training()

    assert custom.finished and custom.config == {"lr": 0.5, "nested": {"a": 1}}
    assert [(s, v["loss"], kw) for s, v, kw in custom.calls] == [
        (0, 1.0, {"commit": False}),
        (1, 0.75, {"commit": False}),
        (2, 0.5, {"commit": True}),
    ]
    # The trackers wrote under the ProjectConfiguration's logging_dir, not its project_dir.
    assert [r["loss"] for r in read_metrics(tmp_path / "logs" / "exp")] == [1.0, 0.75, 0.5]
    assert read_config(tmp_path / "logs" / "exp") == {"lr": 0.5, "nested": {"a": 1}}
    assert len(list((tmp_path / "logs" / "exp").glob("events.out.tfevents.*"))) == 1


def test_default_is_local_under_project_dir(tmp_path: Path) -> None:
    from accel_tracking import logged_metrics

    accelerator = _accelerator(project_dir=tmp_path)
    accelerator.init_trackers("default_run")
    # transformers' run_glue_no_trainer logs a metric named "step" (Accelerate, with no log_with, logs nothing):
    # the default local tracker stores it apart from its own step instead of refusing it.
    accelerator.log({"x": 1.5, "epoch": 0, "step": 7, "time": 0.5}, step=7)
    assert [t.name for t in accelerator.trackers] == ["local"]
    accelerator.end_training()
    (record,) = read_metrics(tmp_path / "default_run")
    assert record["x"] == 1.5 and record["step"] == 7 and record["metric:step"] == 7 and record["metric:time"] == 0.5
    assert logged_metrics(record) == {"x": 1.5, "epoch": 0, "step": 7, "time": 0.5}


def test_a_non_main_process_gives_up_waiting_for_the_main_processs_init_trackers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a process other than the main one does in init_trackers (run for real in tests/tracking/
    # tracking_two_process.py): it reads the main process's outcome from the store, and waits no longer than the
    # collective timeout for a main process that never makes the call.
    from datetime import timedelta

    import torch.distributed as dist

    from accel_core.accelerator import tracking
    from accel_core.state import process_state

    store = dist.HashStore()
    store.set("accel/init_trackers/9/1", "OSError: disk full")
    assert tracking._await_outcome(store, "accel/init_trackers/9/1", 1) == "OSError: disk full"
    monkeypatch.delitem(process_state._DEFAULT_GROUP_TIMEOUT, "timeout", raising=False)  # no group in this process
    monkeypatch.setenv("ACCEL_COLLECTIVE_TIMEOUT", "0.3")  # accel launch --collective-timeout
    assert process_state.group_timeout() == timedelta(seconds=0.3)
    with pytest.raises(RuntimeError, match=r"init_trackers call #2 waits for the main process's init_trackers"):
        tracking._await_outcome(store, "accel/init_trackers/9/2", 2)


@pytest.mark.slow
def test_log_with_all_starts_every_installed_tracker(offline: Path, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    custom = RecordingTracker()
    accelerator = _accelerator(log_with=["all", custom], project_dir=tmp_path)
    accelerator.init_trackers(
        "everything",
        config={"lr": 0.25},
        init_kwargs={
            "wandb": {"name": "all-run"},
            "comet_ml": {"online": False},
            "mlflow": {
                "run_name": "all-run",
                "backend": "file",
            },  # the SQLite default is tested in test_tracking_backends
        },
    )
    names = [t.name for t in accelerator.trackers]
    assert sorted(names) == ["comet_ml", "local", "mlflow", "recording", "tensorboard", "wandb"]
    for step in range(3):
        accelerator.log({"loss": 3.0 - step}, step=step)
    mlflow_run_id = accelerator.get_tracker("mlflow").run_id
    wandb_dir = Path(accelerator.get_tracker("wandb", unwrap=True).dir).parent
    accelerator.end_training()

    assert [r["loss"] for r in read_metrics(tmp_path / "everything")] == [3.0, 2.0, 1.0]
    rows = [r for r in wandb_reader.history(next(wandb_dir.glob("run-*.wandb"))) if "loss" in r]
    assert [(r["_step"], r["loss"]) for r in rows] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    client = MlflowClient((tmp_path / "mlruns").resolve().as_uri())
    assert [(m.step, m.value) for m in client.get_metric_history(mlflow_run_id, "loss")] == [
        (0, 3.0),
        (1, 2.0),
        (2, 1.0),
    ]
    assert client.get_run(mlflow_run_id).data.params == {"lr": "0.25"}
    archives = list((tmp_path / "comet").glob("*.zip"))
    assert len(archives) == 1
    with zipfile.ZipFile(archives[0]) as archive:
        messages = [json.loads(line) for line in archive.read("messages.json").decode().splitlines() if line]
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    loss = [m for m in metrics if m["metricName"] == "loss"]
    # Once per step: Comet's auto-logging does not also record what the TensorBoard tracker wrote.
    assert [(m["step"], m["metricValue"]) for m in loss] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    assert len(custom.calls) == 3


def test_all_skips_trackers_that_cannot_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from accel_tracking import CometMLTracker, WandBTracker

    # Installed but neither offline nor logged in: "all" must not stop at a login prompt.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
    for key in ("WANDB_MODE", "WANDB_API_KEY", "COMET_API_KEY", "COMET_START_ONLINE", "COMET_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    assert not WandBTracker.is_available() and not CometMLTracker.is_available()
    assert LocalTracker.is_available() and TensorBoardTracker.is_available()
    monkeypatch.setenv("WANDB_MODE", "offline")
    (tmp_path / ".comet.config").write_text("[comet]\napi_key=abc\n")
    assert WandBTracker.is_available() and CometMLTracker.is_available()


def test_unknown_tracker_name_is_a_clear_error() -> None:
    from accel_core.discovery import MissingPackageError

    with pytest.raises(MissingPackageError, match="aim"):
        _accelerator(log_with="aim")


def test_the_stand_in_off_the_main_process_does_nothing_but_refuses_a_typo() -> None:
    from accel_core.accelerator.tracking import _InactiveTracker

    stand_in = _InactiveTracker("wandb")
    stand_in.store_init_configuration({"lr": 0.1})
    stand_in.log({"loss": 1.0}, step=3)
    stand_in.log_images({"sample": []}, step=3)
    stand_in.log_table("rows", columns=["a"], data=[[1]])
    stand_in.finish()
    assert stand_in.tracker is None and stand_in.name == "wandb" and not stand_in.is_active
    with pytest.raises(AttributeError, match="lgo"):
        stand_in.lgo({"loss": 1.0})  # pyright: ignore[reportAttributeAccessIssue]  # the typo under test
