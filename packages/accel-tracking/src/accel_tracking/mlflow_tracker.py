"""MLflow: one MLflow run in the experiment named after the project, stored locally by default."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .base import (
    GeneralTracker,
    flatten_dict,
    is_number,
    make_logging_dir,
    require,
    resolve_logging_dir,
    to_python_scalar,
)

logger = logging.getLogger(__name__)

# MLflow's own limits (mlflow.utils.validation): values longer than this are rejected, and one
# batch carries at most this many params.
_MAX_PARAM_LENGTH = 6000
_MAX_PARAMS_PER_BATCH = 100
# The tracking URI this module last exported through mlflow.set_tracking_uri.
_uri_set_by_us: dict[str, str] = {}


def default_tracking_uri(logging_dir: str | os.PathLike[str] | None, backend: str) -> str:
    """Where the run is stored when neither ``tracking_uri`` nor ``$MLFLOW_TRACKING_URI`` says.

    ``sqlite``: ``<logging_dir>/mlflow.db``, MLflow's recommended local store (no server).
    ``file``: ``<logging_dir>/mlruns``, the older file store, which MLflow 3 keeps in maintenance
    mode behind ``MLFLOW_ALLOW_FILE_STORE=true``.
    """
    root = resolve_logging_dir(logging_dir, "mlflow").resolve()
    if backend == "sqlite":
        return f"sqlite:///{root / 'mlflow.db'}"
    if backend == "file":
        return (root / "mlruns").as_uri()
    raise ValueError(f"MLflowTracker backend must be 'sqlite' or 'file', got {backend!r}.")


class MLflowTracker(GeneralTracker):
    """Logs params and metrics to MLflow; the project name is the MLflow experiment.

    By default the store is local, under the project's logging_dir (``./runs`` when unset): a
    SQLite database ``mlflow.db`` with artifacts in ``mlartifacts/``, or ``backend="file"`` for an
    ``mlruns/`` file store. ``tracking_uri=`` or ``$MLFLOW_TRACKING_URI`` points elsewhere (a
    server, Databricks). Other ``init_kwargs``: ``run_name``, ``run_id`` (resume), ``tags``,
    ``nested_run``, ``description``. Look at it with ``mlflow ui --backend-store-uri <uri>``.
    ``save_state`` keeps the run id: a job resumed from the checkpoint (``resume="auto"``) logs
    into the same run (``continue_run``).

    Example::

        accelerator = Accelerator(log_with="mlflow", project_dir="out")
        accelerator.init_trackers("exp", config={"lr": 1e-3}, init_kwargs={"mlflow": {"run_name": "baseline"}})
        accelerator.log({"loss": 0.3}, step=1)      # out/mlflow.db
    """

    name = "mlflow"
    requires_logging_directory = False
    library = "mlflow"
    extra = "mlflow"

    def __init__(
        self,
        experiment_name: str,
        logging_dir: str | os.PathLike[str] | None = None,
        *,
        tracking_uri: str | None = None,
        backend: str = "sqlite",
        run_name: str | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        nested_run: bool = False,
        description: str | None = None,
    ) -> None:
        mlflow = require("mlflow", self.extra)
        self.experiment_name = str(experiment_name)
        env_uri = os.environ.get("MLFLOW_TRACKING_URI") or None  # set but empty means unset
        if env_uri is not None and env_uri == _uri_set_by_us.get("uri"):
            # mlflow.set_tracking_uri exports the variable itself: our previous run's store, not a user choice.
            env_uri = None
        uri = tracking_uri or env_uri
        local_default = uri is None
        root: Path | None = None
        if local_default:
            uri = default_tracking_uri(logging_dir, backend)
            root = resolve_logging_dir(logging_dir, self.name)
            make_logging_dir(root, self.name)
            if backend == "file":
                # The user chose the file store by name; MLflow 3 refuses it without this opt-in.
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        mlflow.set_tracking_uri(uri)
        if os.environ.get("MLFLOW_TRACKING_URI") == uri and env_uri != uri:
            _uri_set_by_us["uri"] = uri

        client = mlflow.MlflowClient(uri)
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            # Left to itself a SQLite store puts artifacts in ./mlruns of the working directory;
            # keep them beside the database instead.
            artifacts = (root.resolve() / "mlartifacts").as_uri() if root is not None else None
            experiment_id = client.create_experiment(self.experiment_name, artifact_location=artifacts)
        else:
            experiment_id = experiment.experiment_id
        self.active_run = mlflow.start_run(
            run_id=run_id,
            experiment_id=experiment_id,
            run_name=run_name,
            nested=nested_run,
            tags=tags,
            description=description,
        )
        self.run_id = self.active_run.info.run_id
        # Per metric, the last step the run already holds when it was continued (``continue_run``).
        self._logged_through: dict[str, int] = {}

    def continue_run(self, run_id: str, last_step: int | None) -> None:
        """Logs into the checkpoint's run ``run_id`` from now on (``resume="auto"``; see ``ContinuableTracker``).

        The run this attempt started before the checkpoint was loaded holds nothing but its
        config: it is ended and deleted. MLflow cannot forget logged values, so the steps after
        ``last_step`` that the interrupted attempt logged stay, and this attempt does not log them
        again (with an exact resume they are the same values): each step is in the run once.
        """
        import mlflow

        client = mlflow.MlflowClient(self.tracking_uri)
        if run_id != self.run_id:
            started = self.run_id
            mlflow.end_run()
            client.delete_run(started)
            self.active_run = mlflow.start_run(run_id=run_id)
            self.run_id = run_id
        self._logged_through = {
            key: max(metric.step for metric in client.get_metric_history(run_id, key))
            for key in client.get_run(run_id).data.metrics
        }

    @property
    def tracker(self) -> Any:
        """The ``mlflow.ActiveRun``."""
        return getattr(self, "active_run", None)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import mlflow

        params = {}
        for key, value in flatten_dict(dict(values)).items():
            text = str(to_python_scalar(value))
            if len(text) > _MAX_PARAM_LENGTH:
                logger.warning(
                    "MLflow: param %r is longer than %d characters; it is truncated.", key, _MAX_PARAM_LENGTH
                )
                text = text[:_MAX_PARAM_LENGTH]
            params[key] = text
        items = list(params.items())
        for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
            mlflow.log_params(dict(items[start : start + _MAX_PARAMS_PER_BATCH]), run_id=self.run_id)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers are logged; anything else is skipped with a warning (MLflow metrics are numbers)."""
        import mlflow

        metrics = {}
        for key, value in values.items():
            value = to_python_scalar(value)
            if step is not None and step <= self._logged_through.get(key, -1):
                continue  # the continued run holds this step from the interrupted attempt
            if is_number(value):
                metrics[key] = float(value)
            else:
                logger.warning("MLflow: %r is a %s, not a number; it is not logged.", key, type(value).__name__)
        if metrics:
            mlflow.log_metrics(metrics, step=step, run_id=self.run_id, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``{key: image}`` with one image (numpy array or PIL image) per key."""
        import mlflow

        for key, image in values.items():
            mlflow.log_image(image, key=key, step=step, **kwargs)  # logs to the active run

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Stored as the artifact ``<table_name>.json``."""
        import mlflow

        if dataframe is None:
            if columns is None or data is None:
                raise ValueError("log_table needs `columns` and `data`, or a pandas `dataframe`.")
            dataframe = {column: [row[i] for row in data] for i, column in enumerate(columns)}
        mlflow.log_table(data=dataframe, artifact_file=f"{table_name}.json", run_id=self.run_id, **kwargs)

    def finish(self) -> None:
        import mlflow

        if getattr(self, "active_run", None) is not None:
            mlflow.end_run()
            self.active_run = None
