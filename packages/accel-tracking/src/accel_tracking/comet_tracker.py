"""Comet: one Comet experiment per run; offline (a zip archive on disk) when asked."""

from __future__ import annotations

import os
from typing import Any

from .base import GeneralTracker, is_number, require, resolve_logging_dir, to_python_scalar


class CometMLTracker(GeneralTracker):
    """Logs to a Comet experiment in the project named by ``init_trackers``.

    Extra ``init_kwargs`` go to ``comet_ml.start`` (``workspace``, ``online``, ``mode``,
    ``experiment_key``, ``experiment_config``). Online needs a Comet API key. Offline
    (``online=False`` or ``COMET_START_ONLINE=false``) needs no network: the experiment is an
    archive under ``<logging_dir>/comet`` (or ``$COMET_OFFLINE_DIRECTORY``) that ``comet upload``
    sends later. Unless you pass your own ``experiment_config``, Comet's automatic metric logging
    is off (accel logs the metrics; Comet would otherwise also record what TensorBoard writes).

    Example::

        accelerator = Accelerator(log_with="comet_ml", project_dir="out")
        accelerator.init_trackers("my_project", init_kwargs={"comet_ml": {"online": False}})
    """

    name = "comet_ml"
    requires_logging_directory = False
    library = "comet_ml"
    extra = "comet_ml"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        comet_ml = require("comet_ml", self.extra)
        self.run_name = str(run_name)
        if "experiment_config" not in kwargs:
            options: dict[str, Any] = {
                # accel logs the metrics itself; Comet's auto-logging would also catch what the
                # TensorBoard tracker writes and record every metric twice.
                "auto_metric_logging": False,
            }
            if not os.environ.get("COMET_OFFLINE_DIRECTORY"):
                # Only used offline: keep the archive with the rest of the project's logs.
                options["offline_directory"] = os.fspath(resolve_logging_dir(logging_dir, self.name) / "comet")
            kwargs["experiment_config"] = comet_ml.ExperimentConfig(**options)
        self.experiment = comet_ml.start(project_name=self.run_name, **kwargs)

    @classmethod
    def is_available(cls) -> bool:
        """Installed, and able to start: offline (``COMET_START_ONLINE=false``) or an API key configured.

        ``log_with="all"`` uses this so that an installed but unconfigured Comet does not stop the run.
        """
        if not super().is_available():
            return False
        if os.environ.get("COMET_START_ONLINE", "").strip().lower() in ("0", "false", "no", "off"):
            return True
        if os.environ.get("COMET_API_KEY"):
            return True
        config = os.environ.get("COMET_CONFIG") or os.path.join(os.path.expanduser("~"), ".comet.config")
        return os.path.isfile(config)

    @property
    def tracker(self) -> Any:
        """The ``comet_ml`` experiment."""
        return getattr(self, "experiment", None)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.experiment.log_parameters(dict(values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers are metrics, strings "other" values, dicts of numbers grouped metrics."""
        if step is not None:
            self.experiment.set_step(step)
        for key, value in values.items():
            value = to_python_scalar(value)
            if is_number(value):
                self.experiment.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.experiment.log_other(key, value)
            elif isinstance(value, dict):
                self.experiment.log_metrics(value, prefix=key, step=step, **kwargs)
            else:
                raise TypeError(
                    f"Comet cannot log {key!r} of type {type(value).__name__}: log numbers, strings or dicts."
                )

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``{name: image or list of images}``; each image anything ``Experiment.log_image`` takes."""
        for key, images in values.items():
            for image in images if isinstance(images, (list, tuple)) else [images]:
                self.experiment.log_image(image, name=key, step=step, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Stored as the asset ``<table_name>.csv``."""
        if step is not None:
            self.experiment.set_step(step)
        if dataframe is not None:
            self.experiment.log_table(f"{table_name}.csv", tabular_data=dataframe, **kwargs)
        else:
            if columns is None or data is None:
                raise ValueError("log_table needs `columns` and `data`, or a pandas `dataframe`.")
            self.experiment.log_table(f"{table_name}.csv", tabular_data=data, headers=list(columns), **kwargs)

    def finish(self) -> None:
        experiment = getattr(self, "experiment", None)
        if experiment is not None:
            experiment.end()
