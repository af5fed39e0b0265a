"""Each third-party tracker with its real library, its output read back with that library's reader.

Nothing here touches the network: W&B runs with WANDB_MODE=offline, MLflow writes a local store,
Comet writes an offline archive. A missing library fails these tests (CI installs them all).
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest runs with --import-mode=importlib
import tracking_wandb_reader as wandb_reader


@pytest.fixture
def offline_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """W&B and Comet offline, their caches and settings inside tmp_path."""
    home = tmp_path / "home"
    for key, sub in (
        ("WANDB_DIR", "wandb"),
        ("WANDB_CONFIG_DIR", "wandb_config"),
        ("WANDB_CACHE_DIR", "wandb_cache"),
        ("WANDB_DATA_DIR", "wandb_data"),
    ):
        (home / sub).mkdir(parents=True)
        monkeypatch.setenv(key, str(home / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("COMET_API_KEY", raising=False)
    monkeypatch.delenv("COMET_OFFLINE_DIRECTORY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


def test_tensorboard_event_files_read_back(tmp_path: Path) -> None:
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from accel_tracking import TensorBoardTracker

    tracker = TensorBoardTracker("tb_run", tmp_path, flush_secs=1)
    assert tracker.tracker is tracker.writer and tracker.logging_dir == str(tmp_path / "tb_run")
    tracker.store_init_configuration({"lr": 0.01, "optim": {"name": "adam", "betas": [0.9, 0.99]}, "epochs": 3})
    losses = [1.0, 0.5, 0.25, 0.125]
    for step, loss in enumerate(losses):
        tracker.log({"loss": torch.tensor(loss), "epoch_frac": np.float32(step / 4)}, step=step * 10)
    tracker.log({"status": "halfway", "lr": {"group0": 0.01, "group1": 0.001}}, step=40)
    tracker.log_images({"samples": np.random.default_rng(0).random((2, 3, 8, 8))}, step=40)
    with pytest.raises(TypeError, match="TensorBoard cannot log"):
        tracker.log({"bad": object()}, step=1)
    tracker.finish()

    events = list((tmp_path / "tb_run").glob("events.out.tfevents.*"))
    assert len(events) == 1, events  # hparams live in the run's own file, not a second folder
    acc = EventAccumulator(str(tmp_path / "tb_run"), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [0, 10, 20, 30]
    assert [e.value for e in loss] == pytest.approx(losses)
    assert [e.value for e in acc.Scalars("epoch_frac")] == pytest.approx([0, 0.25, 0.5, 0.75])
    text = acc.Tensors("status/text_summary")
    assert text[0].step == 40 and text[0].tensor_proto.string_val[0] == b"halfway"
    images = acc.Images("samples")
    assert len(images) == 1 and images[0].step == 40 and (images[0].width, images[0].height) == (16, 8)
    # add_scalars writes each member as its own sub-run folder, as TensorBoard does.
    group = EventAccumulator(str(tmp_path / "tb_run" / "lr_group1"))
    group.Reload()
    assert group.Scalars("lr")[0].value == pytest.approx(0.001)
    # The hyperparameters, read through the HParams plugin's own protobuf.
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    data = plugin_data_pb2.HParamsPluginData.FromString(content)
    hparams = {
        k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in data.session_start_info.hparams.items()
    }
    assert hparams == {"lr": 0.01, "optim/name": "adam", "optim/betas": "[0.9, 0.99]", "epochs": 3.0}


@pytest.mark.slow
def test_wandb_offline_history_read_back(offline_env: Path, tmp_path: Path) -> None:
    from accel_tracking import WandBTracker
    from accel_tracking.base import LoggerType

    assert WandBTracker.is_available() and str(LoggerType.WANDB) == "wandb"
    tracker = WandBTracker("accel-test", tmp_path / "logs", name="run-a", tags=["ci"])
    run = tracker.tracker
    assert run is tracker.run and run.project == "accel-test" and run.name == "run-a"
    tracker.store_init_configuration({"lr": 0.1, "model": {"layers": 2}})
    for step, loss in enumerate([0.9, 0.6, 0.3]):
        tracker.log({"loss": loss, "acc": step / 2}, step=step)
    tracker.log({"loss": 0.1}, step=5, commit=True)
    tracker.log_table("preds", columns=["x", "y"], data=[[1, "a"], [2, "b"]], step=6)
    tracker.log_images({"img": np.zeros((4, 4, 3), dtype=np.uint8)}, step=7)
    run_dir = Path(run.dir).parent
    tracker.finish()

    # WANDB_DIR wins over the project's logging_dir, as documented.
    assert str(run_dir).startswith(str(offline_env / "wandb")) and not (tmp_path / "logs").exists()
    logs = list(run_dir.glob("run-*.wandb"))
    assert len(logs) == 1
    rows = wandb_reader.history(logs[0])
    metric_rows = [r for r in rows if "loss" in r]
    assert [r["_step"] for r in metric_rows] == [0, 1, 2, 5]
    assert [r["loss"] for r in metric_rows] == pytest.approx([0.9, 0.6, 0.3, 0.1])
    assert [r["acc"] for r in metric_rows[:3]] == pytest.approx([0, 0.5, 1])
    table_row = next(r for r in rows if "preds" in r)
    assert table_row["_step"] == 6 and table_row["preds"]["_type"] == "table-file" and table_row["preds"]["nrows"] == 2
    table = json.loads((run_dir / "files" / table_row["preds"]["path"]).read_text())
    assert table["columns"] == ["x", "y"] and table["data"] == [[1, "a"], [2, "b"]]
    image_row = next(r for r in rows if "img" in r)
    assert image_row["_step"] == 7 and image_row["img"]["count"] == 1 and image_row["img"]["width"] == 4
    config = wandb_reader.config(logs[0])
    assert config["lr"] == 0.1 and config["model"] == {"layers": 2}
    assert wandb_reader.run_info(logs[0])["project"] == "accel-test"


def test_wandb_uses_logging_dir_when_no_wandb_dir(
    offline_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accel_tracking import WandBTracker

    monkeypatch.delenv("WANDB_DIR")
    tracker = WandBTracker("accel-test", tmp_path / "project_logs")
    tracker.log({"x": 1.0}, step=0)
    tracker.finish()
    logs = list((tmp_path / "project_logs" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1 and wandb_reader.history(logs[0])[0]["x"] == 1.0


@pytest.mark.slow
def test_mlflow_local_store_read_back(offline_env: Path, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from accel_tracking import MLflowTracker

    results = {}
    for backend in ("sqlite", "file"):
        logs = tmp_path / backend
        tracker = MLflowTracker("accel-exp", logs, backend=backend, run_name=f"run-{backend}", tags={"team": "a"})
        assert tracker.tracker is tracker.active_run
        tracker.store_init_configuration({"lr": 0.01, "opt": {"name": "sgd"}, "long": "x" * 7000})
        for step, loss in enumerate([2.0, 1.0, 0.5]):
            tracker.log({"loss": loss, "acc": np.float64(step / 3), "phase": "train"}, step=step * 2)
        tracker.log_table("preds", columns=["x", "y"], data=[[1, 2], [3, 4]])
        run_id = tracker.run_id
        tracker.finish()
        results[backend] = (tracker.tracking_uri, run_id)

    sqlite_uri, _ = results["sqlite"]
    assert sqlite_uri == f"sqlite:///{(tmp_path / 'sqlite' / 'mlflow.db').resolve()}"
    assert (tmp_path / "sqlite" / "mlflow.db").is_file() and (tmp_path / "file" / "mlruns").is_dir()
    for backend, (uri, run_id) in results.items():
        client = MlflowClient(uri)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and run.info.run_name == f"run-{backend}"
        assert client.get_experiment(run.info.experiment_id).name == "accel-exp"
        history = client.get_metric_history(run_id, "loss")
        assert [(m.step, m.value) for m in history] == [(0, 2.0), (2, 1.0), (4, 0.5)]
        assert [m.value for m in client.get_metric_history(run_id, "acc")] == pytest.approx([0, 1 / 3, 2 / 3])
        assert "phase" not in run.data.metrics  # strings are not metrics
        assert run.data.params["lr"] == "0.01" and run.data.params["opt/name"] == "sgd"
        assert len(run.data.params["long"]) == 6000
        assert run.data.tags["team"] == "a"
        artifacts = Path(run.info.artifact_uri.removeprefix("file://"))
        assert artifacts.is_relative_to(tmp_path / backend)  # nothing lands in the working directory
        table = json.loads((artifacts / "preds.json").read_text())
        assert table["columns"] == ["x", "y"] and table["data"] == [[1, 2], [3, 4]]


@pytest.mark.slow
def test_comet_offline_archive_read_back(offline_env: Path, tmp_path: Path) -> None:
    import comet_ml

    from accel_tracking import CometMLTracker

    assert CometMLTracker.is_available()
    quiet = comet_ml.ExperimentConfig(
        offline_directory=str(tmp_path / "comet"),
        auto_metric_logging=False,
        auto_param_logging=False,
        auto_output_logging=False,
        log_code=False,
        log_graph=False,
        log_git_metadata=False,
        log_env_details=False,
        display_summary_level=0,
    )
    tracker = CometMLTracker("accel-proj", tmp_path, experiment_config=quiet)
    tracker.experiment.set_name("run-c")  # not ExperimentConfig(name=...): comet-ml 3.40 (the floor) lacks it
    tracker.store_init_configuration({"lr": 0.2})
    for step, loss in enumerate([3.0, 2.0, 1.0]):
        tracker.log({"loss": loss, "stage": "train"}, step=step)
    tracker.finish()

    archives = list((tmp_path / "comet").glob("*.zip"))
    assert len(archives) == 1
    with zipfile.ZipFile(archives[0]) as archive:
        experiment = json.loads(archive.read("experiment.json"))
        messages = [json.loads(line) for line in archive.read("messages.json").decode().splitlines() if line]
    assert experiment["project_name"] == "accel-proj"
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    loss = [(m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "loss"]
    assert loss == [(0, 3.0), (1, 2.0), (2, 1.0)]
    params = {
        m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
        for m in messages
        if m["type"] == "parameter_msg"
    }
    assert params["lr"] == 0.2
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert others["stage"] == "train" and others["Name"] == "run-c"
