"""Weights & Biases: one ``wandb`` run per training run; offline when ``WANDB_MODE=offline``."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from .base import GeneralTracker, make_logging_dir, require

logger = logging.getLogger(__name__)


class WandBTracker(GeneralTracker):
    """Logs to a W&B run whose project is the ``init_trackers`` project name.

    Extra ``init_kwargs`` go to ``wandb.init`` (``entity``, ``name``, ``tags``, ``mode``, ...).
    Where the files go: ``dir=`` if given, else ``$WANDB_DIR``, else the project's logging_dir,
    else wandb's default (the working directory). Set ``WANDB_MODE=offline`` (or pass
    ``mode="offline"``) to work without a network; ``wandb sync`` uploads such a run later.

    Example::

        accelerator = Accelerator(log_with="wandb")
        accelerator.init_trackers("my_project", config={"lr": 1e-3},
                                  init_kwargs={"wandb": {"name": "baseline", "tags": ["v1"]}})
    """

    name = "wandb"
    requires_logging_directory = False
    library = "wandb"
    extra = "wandb"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        wandb = require("wandb", self.extra)
        self.run_name = str(run_name)
        if "dir" not in kwargs:
            # Read $WANDB_DIR now and pass it on: wandb's process-wide settings keep the value
            # they first saw, so a later change of the variable would otherwise be ignored.
            chosen = os.environ.get("WANDB_DIR") or (None if logging_dir is None else os.fspath(logging_dir))
            if chosen is not None:
                make_logging_dir(chosen, self.name)
                kwargs["dir"] = chosen
        self._init_kwargs = kwargs  # continue_run reopens another run with the same settings
        self.run = wandb.init(project=self.run_name, **kwargs)
        # Steps below this are in the run already (a continued run): W&B would drop them with a warning.
        self._first_new_step = 0

    @property
    def run_id(self) -> str | None:
        """The W&B run id (kept by ``save_state``, so that a resumed job logs into the same run)."""
        run = getattr(self, "run", None)
        return None if run is None else run.id

    def continue_run(self, run_id: str, last_step: int | None) -> None:
        """Logs into the checkpoint's run ``run_id`` from now on (``resume="auto"``; see ``ContinuableTracker``).

        The run this attempt started before the checkpoint was loaded holds nothing but its
        config: it is finished and removed (offline: its folder, which ``wandb sync`` would
        otherwise upload as an empty run; online: deleted on the server, or a warning says why
        not). The checkpoint's run is reopened with ``wandb.init(id=run_id, resume="allow")`` and
        the same settings and config. Online, W&B resumes the run after the last step it holds
        and keeps the steps the interrupted attempt logged after the checkpoint; this attempt
        does not log those again (with an exact resume they are the same values): each step is
        in the run once. Offline, the attempt writes a new segment of the same run id
        (``offline-run-*-<id>``) starting after ``last_step``; ``wandb sync`` adds it to the run.
        """
        import wandb

        if run_id == self.run.id:
            return
        started, offline = self.run, bool(self.run.offline)
        config = dict(started.config)  # what init_trackers stored: the reopened run gets it too
        folder = Path(started.dir).parent  # <dir>/wandb/(offline-)run-<time>-<id>
        started.finish()
        if offline:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            _delete_online_run(started.path)
        self.run = wandb.init(project=self.run_name, **{**self._init_kwargs, "id": run_id, "resume": "allow"})
        if config:
            self.run.config.update(config, allow_val_change=True)
        self._first_new_step = self.run.step if self.run.resumed else 0

    @classmethod
    def is_available(cls) -> bool:
        """Installed, and able to start without asking for a login: offline mode or a known API key.

        ``log_with="all"`` uses this, so a machine where wandb is merely installed is not stopped
        by a login prompt; ``log_with="wandb"`` always tries (and wandb says what is missing).
        """
        if not super().is_available():
            return False
        if os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "disabled") or os.environ.get(
            "WANDB_API_KEY"
        ):
            return True
        return _netrc_has("api.wandb.ai")

    @property
    def tracker(self) -> Any:
        """The ``wandb.Run``."""
        return getattr(self, "run", None)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # allow_val_change: init_trackers may be called again with an updated config.
        self.run.config.update(dict(values), allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if step is not None and step < self._first_new_step:
            return  # the continued run holds this step already (continue_run)
        self.run.log(values, step=step, **kwargs)

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """``{key: image or list of images}``; each image anything ``wandb.Image`` takes."""
        import wandb

        logged = {}
        for key, images in values.items():
            images = images if isinstance(images, (list, tuple)) else [images]
            logged[key] = [wandb.Image(image) for image in images]
        self.log(logged, step=step, **kwargs)

    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        import wandb

        # wandb types columns and rows with its own aliases (ColumnKey, InputRow) that lists of str / values satisfy.
        table = wandb.Table(columns=columns, data=data, dataframe=dataframe)  # pyright: ignore[reportArgumentType]
        self.log({table_name: table}, step=step, **kwargs)

    def finish(self) -> None:
        run = getattr(self, "run", None)
        if run is not None:
            run.finish()


def _delete_online_run(path: str) -> None:
    """Deletes an (empty) run on the W&B server; a warning when that fails, since training goes on either way."""
    import wandb
    from wandb.errors import Error as WandBError

    try:
        wandb.Api().run(path).delete()
    except (WandBError, OSError) as exc:  # W&B refused, or the network: the run stays, empty
        logger.warning("W&B: could not delete the empty run %s started before the resume (%s).", path, exc)


def _netrc_has(host: str) -> bool:
    """Whether ``wandb login`` stored a key for ``host`` in the netrc file."""
    import netrc

    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False
