"""What accel-core expects from the packages it discovers (see ``plugins``), as typing protocols.

Core calls these and nothing else, so a package can be replaced by any object that answers them.
This module must not import torch at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .accelerator import Accelerator


@runtime_checkable
class DataLoaderPreparer(Protocol):
    """Registered as ``accel.preparers: dataloader`` (accel-data)."""

    def prepare(self, dataloader: Any, accelerator: Accelerator, device_placement: bool) -> Any:
        """Returns the loader sharded over the mesh's data parallelism.

        Reads of the Accelerator: ``parallel_dims.dp`` (a ``MeshGroup``: ``size``, ``rank``,
        ``group``; tensor- and context-parallel peers have the same ``dp.rank`` and must get the
        same batches), ``dataloader_config``, ``device`` and ``rng_types``.

        The prepared loader registers itself with ``GradientState`` while it iterates
        (``_add_dataloader`` / ``_remove_dataloader``) and exposes ``end_of_dataloader`` (bool) and
        ``remainder`` (real samples in the last global batch, -1 when unknown).
        """

    def skip_first_batches(self, dataloader: Any, num_batches: int) -> Any:
        """A loader that starts ``num_batches`` batches in, without reading the skipped samples."""


@runtime_checkable
class CheckpointHandler(Protocol):
    """Registered as ``accel.checkpoint: state`` (accel-checkpoint)."""

    def save_state(self, accelerator: Accelerator, output_dir: str | None, **kwargs: Any) -> str:
        """Writes everything the accelerator prepared or registered; returns the folder written."""

    def load_state(self, accelerator: Accelerator, input_dir: str | None, **kwargs: Any) -> str:
        """Restores what ``save_state`` wrote into the prepared objects; returns the folder loaded."""

    def save_model(self, accelerator: Accelerator, model: Any, save_directory: str, **kwargs: Any) -> None:
        """Writes the model's weights (safetensors by default) for use outside accel."""

    def wait(self, accelerator: Accelerator) -> str | None:
        """Blocks until the accelerator's asynchronous save is written; returns its folder."""


@runtime_checkable
class Tracker(Protocol):
    """A tracker class registered under ``accel.trackers`` is built as ``cls(run_name, logging_dir, **init_kwargs)``.

    Class attributes: ``name`` (str) and ``requires_logging_directory`` (bool); a classmethod
    ``is_available()`` says whether its third-party library is importable (used by ``log_with="all"``).
    """

    name: str

    def store_init_configuration(self, values: dict[str, Any]) -> None: ...

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None: ...

    def finish(self) -> None: ...
