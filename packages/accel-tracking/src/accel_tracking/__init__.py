"""accel's experiment trackers, found by the Accelerator through the ``accel.trackers`` entry points.

``import accel_tracking`` imports no tracking library (and not torch): the names below load their
module on first use.

Example::

    from accel_tracking import LocalTracker, plot_metrics

    tracker = LocalTracker("demo", "logs")
    for step in range(10):
        tracker.log({"loss": 1 / (step + 1)}, step=step)
    tracker.finish()
    plot_metrics("logs/demo", keys=["loss"])   # logs/demo/metrics.png
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accel_core.lazy import lazy_exports

from .base import GeneralTracker, LoggerType, is_main_process, process_index

__version__ = "0.1.0"

_LAZY = {
    "LocalTracker": "local",
    "read_metrics": "local",
    "logged_metrics": "local",
    "read_config": "local",
    "TensorBoardTracker": "tensorboard_tracker",
    "WandBTracker": "wandb_tracker",
    "MLflowTracker": "mlflow_tracker",
    "CometMLTracker": "comet_tracker",
    "progress_bar": "progress",
    "plot_metrics": "plot",
}

__all__ = [
    "CometMLTracker",
    "GeneralTracker",
    "LocalTracker",
    "LoggerType",
    "MLflowTracker",
    "TensorBoardTracker",
    "WandBTracker",
    "is_main_process",
    "logged_metrics",
    "plot_metrics",
    "process_index",
    "progress_bar",
    "read_config",
    "read_metrics",
]

if TYPE_CHECKING:
    from .comet_tracker import CometMLTracker
    from .local import LocalTracker, logged_metrics, read_config, read_metrics
    from .mlflow_tracker import MLflowTracker
    from .plot import plot_metrics
    from .progress import progress_bar
    from .tensorboard_tracker import TensorBoardTracker
    from .wandb_tracker import WandBTracker


__getattr__, __dir__ = lazy_exports(globals(), {n: f".{m}" for n, m in _LAZY.items()})
