"""Auto-resume and periodic saves on one process, in this process: the fast lane of tests/faults."""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import signal

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration
from accel_core.protocols import ReportsBatchBoundaries
from accel_data import prepare_data_loader
from accel_launch.plan import resolve_plan
from accel_launch.rendezvous import RDZV_STORE_SHARING_OFF
from accel_tracking.local import LocalTracker, read_metrics

STEPS_PER_EPOCH = 4  # 16 samples, batches of 2, 2 micro-batches per step
EPOCHS = 3


def _config(project, every=None):
    return ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=3, save_every_n_steps=every
    )


def _run(project, *, stop_after=None, every=2, resume=None):
    """Trains (prepared in two calls, as some scripts do); ``stop_after`` steps abandon the run like a crash."""
    accelerator = Accelerator(
        cpu=True, project_config=_config(project, every), gradient_accumulation_steps=2, resume=resume
    )
    torch.manual_seed(0)
    data = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(data, data.sum(1)), batch_size=2, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert accelerator.resumed_from is None  # the checkpoint also holds a loader and a scheduler: not yet
    loader, scheduler = accelerator.prepare(loader, scheduler)
    start = (accelerator.resumed_from, accelerator.completed_steps, loader.epoch)
    losses = {}
    for _ in range(loader.epoch, EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                losses[accelerator.completed_steps] = loss.item()
                if accelerator.completed_steps == stop_after:
                    return start, losses, None
    return start, losses, {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def test_a_restarted_script_resumes_where_its_last_periodic_save_left_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CHECKPOINT_FSYNC", "0")  # a lost process, not a power cut: no fsync needed
    _, reference_losses, reference = _run(tmp_path / "reference", every=None)
    assert sorted(reference_losses) == list(range(1, STEPS_PER_EPOCH * EPOCHS + 1))

    project = tmp_path / "run"
    start, first, _ = _run(project, stop_after=7, resume="auto")  # "killed" after step 7
    assert start == (None, 0, 0)
    # Saves after steps 2, 4, 6 (the one of step 6 taken when the loop asked for step 7's first batch).
    assert sorted(os.listdir(project / "checkpoints")) == ["checkpoint_0", "checkpoint_1", "checkpoint_2"]
    manifest = json.loads((project / "checkpoints" / "checkpoint_2" / "accel_checkpoint.json").read_text())
    assert manifest["progress"]["completed_steps"] == 6

    start, second, final = _run(project, resume="auto")
    assert start == (str(project / "checkpoints" / "checkpoint_2"), 6, 1)  # step 6 ended epoch 1's 2nd step
    assert sorted(second) == list(range(7, 13))
    assert {**first, **second} == reference_losses  # the same numbers, step for step
    assert final is not None and reference is not None
    for name in reference:
        assert torch.equal(final[name], reference[name]), name
    # The numbering went on (7 -> checkpoint_3 ...), total_limit=3 rotated the oldest away.
    assert sorted(os.listdir(project / "checkpoints")) == ["checkpoint_3", "checkpoint_4", "checkpoint_5"]


def _train_steps(accelerator, model, optimizer, loader, steps):
    """Trains until ``completed_steps == steps``, one optimizer step per batch, over as many epochs as that takes."""
    while accelerator.completed_steps < steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if accelerator.completed_steps == steps:
                break


def test_two_accelerators_each_save_through_the_hooks_of_their_own_loaders(tmp_path, monkeypatch, caplog):
    """Each Accelerator hands the loaders it prepared its own boundary hook: the newer one takes nothing over."""
    monkeypatch.setenv("ACCEL_CHECKPOINT_FSYNC", "0")
    caplog.set_level(logging.INFO, logger="accel_core")
    jobs = {}
    for name, every in (("a", 2), ("b", 3)):  # "b" is made after "a" has prepared its loader
        accelerator = Accelerator(cpu=True, project_config=_config(tmp_path / name, every))
        data = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(TensorDataset(data, data.sum(1)), batch_size=2)  # 4 batches an epoch
        jobs[name] = (accelerator, *accelerator.prepare(model, optimizer, loader))
    (a, *job_a), (b, *job_b) = jobs["a"], jobs["b"]
    loader_a, loader_b = job_a[2], job_b[2]
    assert isinstance(loader_a, ReportsBatchBoundaries) and isinstance(loader_b, ReportsBatchBoundaries)
    hook_a, hook_b = loader_a.batch_boundary_hook, loader_b.batch_boundary_hook
    assert hook_a is not None and hook_b is not None and hook_a is not hook_b
    assert a.skip_first_batches(loader_a, 1).batch_boundary_hook is hook_a  # a resumed epoch reports alike
    assert copy.deepcopy(loader_a).batch_boundary_hook is hook_a
    assert pickle.loads(pickle.dumps(loader_a)).batch_boundary_hook is None  # for another process: no Accelerator
    assert prepare_data_loader(loader_b, boundary_hook=hook_a) is loader_b  # prepared again: keeps its hook
    assert loader_b.batch_boundary_hook is hook_b

    # a's loop, after b exists: saves after step 2 (asked for batch 3) and step 4 (the epoch's end), in a's folder.
    _train_steps(a, *job_a, steps=5)
    assert sorted(os.listdir(tmp_path / "a" / "checkpoints")) == ["checkpoint_0", "checkpoint_1"]
    assert not (tmp_path / "b" / "checkpoints").exists()
    _train_steps(b, *job_b, steps=4)  # saves after step 3, in b's folder
    assert sorted(os.listdir(tmp_path / "b" / "checkpoints")) == ["checkpoint_0"]
    assert sorted(os.listdir(tmp_path / "a" / "checkpoints")) == ["checkpoint_0", "checkpoint_1"]
    manifest = json.loads((tmp_path / "b" / "checkpoints" / "checkpoint_0" / "accel_checkpoint.json").read_text())
    assert manifest["progress"]["completed_steps"] == 3

    saves = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "Periodic" in r.getMessage()]
    expected = [("a", 2, 2, 0), ("a", 2, 4, 1), ("b", 3, 3, 0)]  # (project, every, step, checkpoint number)
    assert saves == [
        f"Periodic checkpoint (save_every_n_steps={every}) after optimizer step {step}, taken at a step boundary "
        f"of its DataLoaderShard: {tmp_path / name / 'checkpoints' / f'checkpoint_{number}'}"
        for name, every, step, number in expected
    ]


def test_without_resume_the_same_restart_starts_over_and_collides_with_its_checkpoints(tmp_path):
    """The counter-check: without resume="auto" a restarted script neither continues nor can save."""
    _run(tmp_path, stop_after=3)
    with pytest.raises(Exception, match="already exists"):
        _run(tmp_path)


def test_bad_settings_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="save_every_n_steps must be an integer >= 1"):
        ProjectConfiguration(save_every_n_steps=0)
    with pytest.raises(ValueError, match="automatic_checkpoint_naming=True"):
        Accelerator(cpu=True, resume="auto")
    with pytest.raises(ValueError, match="automatic_checkpoint_naming=True"):
        Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path), save_every_n_steps=5))
    with pytest.raises(ValueError, match="resume must be None or 'auto'"):
        Accelerator(cpu=True, project_config=_config(tmp_path), resume="latest")
    monkeypatch.setenv("ACCEL_AUTO_RESUME", "1")
    with pytest.raises(ValueError, match="ACCEL_AUTO_RESUME"):
        Accelerator(cpu=True)
    assert Accelerator(cpu=True, project_config=_config(tmp_path)).resume == "auto"


def test_launch_plan_auto_resume_and_a_store_per_restart_attempt():
    plan = resolve_plan({"num_processes": 2, "max_restarts": 2, "auto_resume": True}, {}, {})
    assert plan.env["ACCEL_AUTO_RESUME"] == "true"
    # torchrun's shared rendezvous store would hand restarted workers the previous attempt's keys.
    assert plan.env[RDZV_STORE_SHARING_OFF] == "1"
    assert RDZV_STORE_SHARING_OFF not in resolve_plan({"num_processes": 2}, {}, {}).env
    kept = resolve_plan({"num_processes": 2, "max_restarts": 1}, {RDZV_STORE_SHARING_OFF: "0"}, {})
    assert RDZV_STORE_SHARING_OFF not in kept.env  # the caller's own choice stands
    assert resolve_plan({}, {"ACCEL_AUTO_RESUME": "1"}, {}).auto_resume


def test_local_tracker_rewind_keeps_the_steps_up_to_the_checkpoint(tmp_path):
    tracker = LocalTracker("run", tmp_path)
    for step in range(1, 6):
        tracker.log({"loss": float(step)}, step=step)
    tracker.log({"note": 1})  # no step: kept
    tracker.finish()
    with open(tmp_path / "run" / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 6, "lo')  # a torn last line, as a SIGKILL mid-write leaves
    resumed = LocalTracker("run", tmp_path)
    resumed.rewind(3)
    resumed.log({"loss": 40.0}, step=4)
    resumed.finish()
    assert [(r["step"], r.get("loss")) for r in read_metrics(tmp_path / "run")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (None, None),
        (4, 40.0),
    ]
    again = LocalTracker("run", tmp_path)
    again.rewind(None)  # a restart before any checkpoint: the stepped records start over
    again.finish()
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [None]


def test_tensorboard_rewind_purges_the_steps_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from accel_tracking.tensorboard_tracker import TensorBoardTracker

    first = TensorBoardTracker("run", tmp_path)
    for step in range(1, 6):
        first.log({"loss": float(step)}, step=step)
    first.finish()
    resumed = TensorBoardTracker("run", tmp_path)
    resumed.rewind(3)
    for step in (4, 5):
        resumed.log({"loss": 10.0 * step}, step=step)
    resumed.finish()
    accumulator = EventAccumulator(str(tmp_path / "run"))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
        (5, 50.0),
    ]


def test_sigterm_saves_the_step_and_exits_143_in_one_process(tmp_path):
    """checkpoint_on_sigterm in one process: the signal is noted, the step's boundary saves, SystemExit(143)."""
    with pytest.raises(ValueError, match="checkpoint_on_sigterm=True saves an automatic checkpoint"):
        Accelerator(
            cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path), checkpoint_on_sigterm=True)
        )
    before = signal.getsignal(signal.SIGTERM)
    config = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, checkpoint_on_sigterm=True
    )
    accelerator = Accelerator(cpu=True, project_config=config, resume="auto")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    with pytest.raises(SystemExit) as ended:
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if accelerator.completed_steps == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # the process lives on: only noted
    assert ended.value.code == 143
    assert accelerator.completed_steps == 3
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_0"]
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back


class _KeptLogs:
    """A custom tracker object (what ``log_with`` accepts besides names) that keeps what it was given."""

    name = "kept"
    requires_logging_directory = False

    def __init__(self):
        self.logged = []

    def store_init_configuration(self, values):
        pass

    def log(self, values, step=None, **kwargs):
        self.logged.append((step, values.get("train/nonfinite_skips")))

    def finish(self):
        pass


def _guarded_steps(accelerator, model, optimizer, nan_at, steps):
    for step in steps:
        loss = model(torch.ones(2, 3)).sum() * (float("nan") if step in nan_at else 1.0)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": 1.0}, step=step)


def test_nonfinite_skip_count_continues_after_load_state(tmp_path):
    def start():
        tracker = _KeptLogs()
        accelerator = Accelerator(cpu=True, skip_nonfinite=True, log_with=tracker)
        accelerator.init_trackers("guard")
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        return accelerator, tracker, *accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    accelerator, _, model, optimizer = start()
    _guarded_steps(accelerator, model, optimizer, nan_at={1, 2}, steps=range(4))
    assert accelerator.nonfinite_skips == 2
    accelerator.save_state(str(tmp_path / "ckpt"))

    resumed, tracker, model, optimizer = start()
    resumed.load_state(str(tmp_path / "ckpt"))
    assert resumed.nonfinite_skips == 2
    _guarded_steps(resumed, model, optimizer, nan_at={5}, steps=range(4, 7))
    assert resumed.nonfinite_skips == 3
    # Logged as the running count of the whole run, once, at the step after the skip.
    assert [entry for entry in tracker.logged if entry[1] is not None] == [(5, 3)]

    # A checkpoint saved without the guard leaves the count at 0.
    plain = Accelerator(cpu=True)
    plain_model = torch.nn.Linear(3, 1)
    plain.prepare(plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.1))
    plain.save_state(str(tmp_path / "plain"))
    guarded, _, _, _ = start()
    guarded.load_state(str(tmp_path / "plain"))
    assert guarded.nonfinite_skips == 0


def _logging_attempt(project, stop_after, tracker_name, init_kwargs):
    """Trains one step per iteration, logging the loss at each; saves at step 3; returns what it logged."""
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config, resume="auto", log_with=tracker_name)
    accelerator.init_trackers("exp", config={"lr": 0.01}, init_kwargs={tracker_name: init_kwargs})
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    logged = {}
    for _ in range(accelerator.completed_steps, stop_after):
        with accelerator.accumulate(model):  # its boundary ends the step: no prepared loader here
            loss = model(torch.ones(2, 3)).pow(2).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        logged[accelerator.completed_steps] = loss.item()
        accelerator.log({"loss": loss.item()}, step=accelerator.completed_steps)
        if accelerator.completed_steps == 3:
            accelerator.save_state()
    return accelerator, logged


@pytest.mark.slow  # two Accelerators and MLflow's import
def test_mlflow_run_continues_after_auto_resume_each_step_once(tmp_path, monkeypatch):
    import mlflow
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("ACCEL_CHECKPOINT_FSYNC", "0")
    first, logged = _logging_attempt(tmp_path, 5, "mlflow", {"backend": "file"})
    run_id = first.get_tracker("mlflow").run_id
    started_here = first._tracking.runs_to_continue
    # The process dies after step 5 (checkpoint at 3): its run is left as a lost process leaves it.
    mlflow.end_run(status="KILLED")

    resumed, logged_again = _logging_attempt(tmp_path, 7, "mlflow", {"backend": "file"})
    tracker = resumed.get_tracker("mlflow")
    assert resumed.resumed_from is not None and tracker.run_id == run_id and started_here == {}
    uri = tracker.tracking_uri
    resumed.end_training()

    client = MlflowClient(uri)
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")]
    assert [step for step, _ in history] == [1, 2, 3, 4, 5, 6, 7]  # each step once
    # Steps 4 and 5 were trained again bit-exactly: the values the run kept are the resumed ones too.
    assert dict(history) == {**logged, **logged_again}
    assert client.get_run(run_id).info.status == "FINISHED"
    # The run the second attempt started before the checkpoint was loaded is deleted, not left empty.
    experiment = client.get_experiment_by_name("exp")
    deleted = client.search_runs([experiment.experiment_id], run_view_type=mlflow.entities.ViewType.DELETED_ONLY)
    assert len(deleted) == 1 and deleted[0].info.run_id != run_id


@pytest.mark.slow  # two Accelerators, W&B's import and its service process
def test_wandb_run_continues_after_auto_resume(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "tracking"))
    import tracking_wandb_reader as wandb_reader

    for key in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        (tmp_path / key).mkdir()
        monkeypatch.setenv(key, str(tmp_path / key))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("ACCEL_CHECKPOINT_FSYNC", "0")
    first, logged = _logging_attempt(tmp_path / "project", 5, "wandb", {"name": "exp-run"})
    run_id = first.get_tracker("wandb").run_id
    first.get_tracker("wandb").finish()  # the process dies after step 5 (checkpoint at 3)

    resumed, logged_again = _logging_attempt(tmp_path / "project", 7, "wandb", {"name": "exp-run"})
    tracker = resumed.get_tracker("wandb")
    assert resumed.resumed_from is not None and tracker.run_id == run_id
    resumed.end_training()

    # Two segments of the one run: the interrupted attempt's and the resumed one's. The run the
    # second attempt started before the checkpoint was loaded (config only) is gone.
    folders = sorted((tmp_path / "WANDB_DIR" / "wandb").glob("offline-run-*"))
    assert [f.name.rsplit("-", 1)[1] for f in folders] == [run_id, run_id]
    segments = [next(f.glob("run-*.wandb")) for f in folders]
    assert {wandb_reader.run_info(s)["run_id"] for s in segments} == {run_id}
    steps = [{row["_step"]: row["loss"] for row in wandb_reader.history(s) if "loss" in row} for s in segments]
    steps.sort(key=min)
    assert list(steps[0]) == [1, 2, 3, 4, 5] and list(steps[1]) == [4, 5, 6, 7]  # resumed after step 3
    assert steps[0] == logged and steps[1] == logged_again
    assert {k: steps[1][k] for k in (4, 5)} == {k: logged[k] for k in (4, 5)}  # trained again bit-exactly
    assert wandb_reader.config(segments[1])["lr"] == 0.01  # the config goes on in the resumed segment
