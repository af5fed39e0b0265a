"""The contracts between accel-core and the packages it discovers (see ``plugins``), as typing protocols.

Both directions are declared here: what core calls on a package (``DataLoaderPreparer``,
``CheckpointHandler``, ``Tracker``), what it hands a package to call back (``BatchBoundaryHook``), and
what such a package may read of the Accelerator it is given (``DataAccelerator``,
``CheckpointAccelerator``). Core calls these and nothing else, so a
package can be replaced by any object that answers them; a package reads the Accelerator through
these and nothing else. Packages import them under ``TYPE_CHECKING``: this module must not import
torch at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from .configuration import DataLoaderConfiguration, ProjectConfiguration
    from .parallel.dims import ParallelDims
    from .strategies import PreparedObjects, Strategy


class DataAccelerator(Protocol):
    """What accel-data reads of the Accelerator (``DataLoaderPreparer.prepare``)."""

    @property
    def parallel_dims(self) -> ParallelDims:
        """The mesh; loaders shard over ``dp`` (``size``, ``rank``, ``group``)."""
        ...

    @property
    def dataloader_config(self) -> DataLoaderConfiguration:
        """``split_batches``, ``dispatch_batches``, ``even_batches`` and the other loader settings."""
        ...

    @property
    def device(self) -> torch.device:
        """Where batches go when device placement is on."""
        ...

    @property
    def rng_types(self) -> Sequence[str] | None:
        """The RNGs synchronised at the start of each epoch."""
        ...


class CheckpointAccelerator(Protocol):
    """What accel-checkpoint reads (and, for ``step``, writes) of the Accelerator (``CheckpointHandler``)."""

    step: int
    """The micro-step counter, saved with the state and restored by ``load_state``."""

    @property
    def strategy(self) -> Strategy:
        """Asked for full and sharded state dicts (``model_state_dict``, ``ShardedCheckpointing``)."""
        ...

    @property
    def prepared(self) -> PreparedObjects:
        """The prepared and registered objects, in ``prepare`` order: what a checkpoint holds."""
        ...

    @property
    def parallel_dims(self) -> ParallelDims:
        """Dataloader positions are saved per data-parallel rank (``dp.size`` of them)."""
        ...

    @property
    def project_configuration(self) -> ProjectConfiguration:
        """Automatic checkpoint naming, ``total_limit`` and ``save_on_each_node``."""
        ...

    @property
    def process_index(self) -> int: ...

    @property
    def num_processes(self) -> int: ...

    @property
    def is_local_main_process(self) -> bool: ...

    @property
    def scaler(self) -> Any:
        """The fp16 ``GradScaler`` (None without one): its state is saved too."""
        ...

    @property
    def save_state_pre_hooks(self) -> Sequence[Callable[..., None]]:
        """``hook(models, weights, output_dir)`` for each ``register_save_state_pre_hook``, in order."""
        ...

    @property
    def load_state_pre_hooks(self) -> Sequence[Callable[..., None]]:
        """``hook(models, input_dir)`` for each ``register_load_state_pre_hook``, in order."""
        ...

    def training_progress(self) -> dict[str, Any]:
        """Plain JSON data about the run (completed optimizer steps, last logged step), saved with the state."""
        ...

    def restore_training_progress(self, progress: dict[str, Any]) -> None:
        """Given back, by ``load_state``, what ``training_progress`` returned when the checkpoint was saved."""
        ...


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a resumed run loads: its folder, and how many objects of each kind it holds.

    counts: ``models``, ``optimizers``, ``schedulers``, ``dataloaders``, ``custom_objects`` (the
    names of ``PreparedObjects``' lists), so the Accelerator knows when everything was prepared again.
    """

    path: str
    counts: dict[str, int] = field(default_factory=dict)


class BatchBoundaryHook(Protocol):
    """What the Accelerator gives each loader it prepares, called at the loop's step boundaries.

    A prepared loader calls ``hook(loader)`` each time the training loop asks it for a batch (before
    the first one too), and once after its epoch has ended (when its epoch count has moved on). The
    loop's previous step is complete there (optimizer, scheduler, logging) and the loader's position
    counts exactly the batches it consumed: the Accelerator takes its periodic checkpoint
    (``save_every_n_steps``) and a pending ``resume="auto"`` there. So the call may be collective
    (every process's loader reaches it at the same step) and is made on the thread that iterates the
    loader the training loop holds. It is called per batch: when nothing is due it returns at once.
    """

    def __call__(self, dataloader: Any) -> None: ...


@runtime_checkable
class ReportsBatchBoundaries(Protocol):
    """A prepared loader that calls ``batch_boundary_hook`` at its step boundaries (see ``BatchBoundaryHook``).

    ``None`` when no Accelerator prepared it (``accel_data.prepare_data_loader`` called directly). A loader that
    wraps a prepared one and reads it on other threads (torch-xla's device loader) takes the hook over: the
    wrapped loader's becomes ``None`` and the wrapper calls it on the loop's thread.
    """

    batch_boundary_hook: BatchBoundaryHook | None


@runtime_checkable
class DataLoaderPreparer(Protocol):
    """Registered as ``accel.preparers: dataloader`` (accel-data)."""

    def prepare(
        self,
        dataloader: Any,
        accelerator: DataAccelerator,
        device_placement: bool,
        boundary_hook: BatchBoundaryHook | None = None,
    ) -> Any:
        """Returns the loader sharded over the mesh's data parallelism.

        Reads of the Accelerator: ``DataAccelerator``. Tensor- and context-parallel peers have the
        same ``parallel_dims.dp.rank`` and must get the same batches.

        The prepared loader registers itself with ``GradientState`` while it iterates
        (``register_dataloader`` / ``unregister_dataloader``) and exposes ``end_of_dataloader`` (bool) and
        ``remainder`` (real samples in the last global batch, -1 when unknown). It keeps ``boundary_hook``
        as its ``batch_boundary_hook`` (``ReportsBatchBoundaries``), and so do the loaders
        ``skip_first_batches`` derives from it. Given a loader it prepared before, it returns that loader,
        which keeps the hook it has (it gets ``boundary_hook`` only if it had none).
        """

    def skip_first_batches(self, dataloader: Any, num_batches: int) -> Any:
        """A loader that starts ``num_batches`` batches in, without reading the skipped samples."""


@runtime_checkable
class CheckpointHandler(Protocol):
    """Registered as ``accel.checkpoint: state`` (accel-checkpoint)."""

    def save_state(self, accelerator: CheckpointAccelerator, output_dir: str | None, **kwargs: Any) -> str:
        """Writes everything the accelerator prepared or registered; returns the folder written."""
        ...

    def load_state(self, accelerator: CheckpointAccelerator, input_dir: str | None, **kwargs: Any) -> str:
        """Restores what ``save_state`` wrote into the prepared objects; returns the folder loaded."""
        ...

    def save_model(self, accelerator: CheckpointAccelerator, model: Any, save_directory: str, **kwargs: Any) -> None:
        """Writes the model's weights (safetensors by default) for use outside accel."""
        ...

    def save_object(self, accelerator: CheckpointAccelerator, obj: Any, f: str, safe_serialization: bool) -> None:
        """``accelerator.save(obj, f, safe_serialization)``: writes ``obj`` on the main process (the first of each
        machine with ``save_on_each_node``); a safetensors file when asked (shared tensors written once)."""
        ...

    def wait(self, accelerator: CheckpointAccelerator) -> str | None:
        """Blocks until the accelerator's asynchronous save is written; returns its folder."""
        ...

    def find_resume_point(self, accelerator: CheckpointAccelerator) -> ResumePoint | None:
        """The newest automatic checkpoint complete on every process, or None. Collective."""
        ...


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


@runtime_checkable
class RewindableTracker(Protocol):
    """A tracker that can continue a run from a checkpoint (the local and TensorBoard trackers).

    ``Accelerator.resume_if_possible`` calls ``rewind`` on the main process once the checkpoint is
    loaded and the tracker started, so the steps the resumed run logs again are not there twice.
    """

    def rewind(self, last_step: int | None) -> None:
        """Forget what was logged with a step after ``last_step`` (None: every record with a step)."""
        ...


@runtime_checkable
class ContinuableTracker(Protocol):
    """A tracker whose runs a service keeps by id (W&B, MLflow): a resumed job logs into the checkpoint's run.

    ``save_state`` keeps ``run_id`` (under the tracker's ``name``); ``Accelerator.resume_if_possible``
    calls ``continue_run`` on the main process once the checkpoint is loaded and the tracker started.
    """

    name: str

    @property
    def run_id(self) -> str | None:
        """The id of the run this tracker logs to."""
        ...

    def continue_run(self, run_id: str, last_step: int | None) -> None:
        """Log into the run ``run_id`` from now on; the steps after ``last_step`` are logged again."""
        ...
