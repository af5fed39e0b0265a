"""TensorBoard: event files under ``<logging_dir>/<run_name>/`` through torch's SummaryWriter."""

from __future__ import annotations

import os
from typing import Any

from .base import GeneralTracker, flatten_dict, make_logging_dir, require, resolve_logging_dir, to_python_scalar


class TensorBoardTracker(GeneralTracker):
    """Logs scalars, text, images and hyperparameters to TensorBoard event files.

    Extra ``init_kwargs`` go to ``torch.utils.tensorboard.SummaryWriter`` (``flush_secs``, ...).
    Without a logging_dir it writes under ``./runs``. Look at a run with
    ``tensorboard --logdir <logging_dir>``.

    Example::

        accelerator = Accelerator(log_with="tensorboard", project_dir="out")
        accelerator.init_trackers("exp1", config={"lr": 1e-3})
        accelerator.log({"loss": 0.25}, step=10)   # out/exp1/events.out.tfevents.*
    """

    name = "tensorboard"
    requires_logging_directory = True
    library = "tensorboard"
    extra = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        require("tensorboard", self.extra)  # torch's writer needs it; fail with the pip hint first
        from torch.utils.tensorboard import SummaryWriter

        self.run_name = str(run_name)
        self.logging_dir = os.fspath(resolve_logging_dir(logging_dir, self.name) / self.run_name)
        make_logging_dir(self.logging_dir, self.name)
        self._writer_kwargs = kwargs
        self.writer = SummaryWriter(self.logging_dir, **kwargs)

    @property
    def tracker(self) -> Any:
        """The ``SummaryWriter``."""
        return getattr(self, "writer", None)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams

        # TensorBoard's HParams plugin accepts numbers, strings and bools only.
        flat = {}
        for key, value in flatten_dict(dict(values)).items():
            value = to_python_scalar(value)
            flat[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
        # Written into this run's own event file (SummaryWriter.add_hparams would open a second
        # run folder), so the hyperparameters stay next to the metrics they belong to.
        experiment, start, end = hparams(flat, {})
        file_writer = self.writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers become scalars, strings text, and a dict of numbers one multi-line chart."""
        for key, value in values.items():
            value = to_python_scalar(value)
            if isinstance(value, (int, float)):  # bools too: TensorBoard plots them as 0/1
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(
                    key, {k: to_python_scalar(v) for k, v in value.items()}, global_step=step, **kwargs
                )
            else:
                raise TypeError(
                    f"TensorBoard cannot log {key!r} of type {type(value).__name__}: log numbers, strings, "
                    "dicts of numbers, or images through log_images."
                )
        self.writer.flush()

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``{tag: batch}`` with batches NCHW by default (pass ``dataformats="NHWC"`` otherwise)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    def rewind(self, last_step: int | None) -> None:
        """Continues the run from a checkpoint: TensorBoard forgets the events after ``last_step``.

        Reopens the writer with ``purge_step=last_step + 1``: its event file starts with a restart
        marker, and TensorBoard drops the events of that step and later from the earlier files, so
        the steps a resumed run logs again appear once. ``None``: every step is forgotten.
        """
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()
        kwargs = {**self._writer_kwargs, "purge_step": 0 if last_step is None else int(last_step) + 1}
        self.writer = SummaryWriter(self.logging_dir, **kwargs)

    def finish(self) -> None:
        writer = getattr(self, "writer", None)
        if writer is not None:
            writer.close()
