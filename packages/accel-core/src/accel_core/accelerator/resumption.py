"""Auto-resume and periodic checkpoints: a restarted job continues where its last checkpoint left it.

Three lines in a script::

    config = ProjectConfiguration(project_dir="runs/exp", automatic_checkpoint_naming=True, save_every_n_steps=100)
    accelerator = Accelerator(project_config=config, resume="auto")         # or `accel launch --auto-resume`
    for epoch in range(train_loader.epoch, num_epochs):                    # the prepared loader's epoch

When the checkpoint is loaded: at the end of the ``prepare`` (or ``register_for_checkpointing``)
call after which everything the checkpoint holds has been prepared again, so the script's usual
order of calls needs no change. Everything is restored there: weights, optimizer, scheduler,
scaler, RNG states, each prepared dataloader's position (its next iteration starts at the next
batch), ``accelerator.step``, ``completed_steps``, the automatic checkpoint number, and the
trackers' runs (the local and TensorBoard trackers forget what was logged after the checkpoint,
so the resumed steps are logged once; the MLflow and W&B trackers log into the checkpoint's run).

When a periodic checkpoint is taken: a real optimizer step (at an accumulation boundary; several
optimizers stepping on one batch count once) makes one due, and it is written when the training
loop next asks the dataloader that was iterating for a batch, or when that loader's epoch ends.
By then the step's scheduler step and logging are done and the loader's position counts exactly
the batches consumed, so resuming repeats nothing and skips nothing. The loaders this Accelerator
prepared report those points through the hook it gave them (``protocols.BatchBoundaryHook``, a
``StepBoundaryHook``): another Accelerator's loaders report to theirs. Without such a loader (a
plain DataLoader, or one prepared elsewhere) the next ``accumulate()`` is the boundary. Each
periodic save is logged at INFO (``accel_core.accelerator.resumption``) with its step and folder.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from .. import environment as env
from ..preemption import EXIT_CODE, PreemptionWatch

if TYPE_CHECKING:
    from ..configuration import ProjectConfiguration
    from ..protocols import ResumePoint
    from ..settings import RunSettings
    from ..state import GradientState
    from ..strategies import PreparedObjects
    from .checkpointing import Checkpointing
    from .nonfinite_guard import NonFiniteGuard
    from .process_control import ProcessControl
    from .tracking import Tracking

logger = logging.getLogger(__name__)

RESUME_MODES = ("auto",)
_NO_STEP = object()  # no optimizer step since the last boundary
_UNKNOWN = object()  # the resume point was not looked up yet


class Resumption:
    """``resume="auto"``, ``completed_steps`` and ``save_every_n_steps`` (the Accelerator's ``resume_if_possible``,
    ``training_progress`` and the step-boundary calls).

    resume: None or ``"auto"`` (None reads ``ACCEL_AUTO_RESUME``). project_configuration: automatic
    checkpoints, ``save_every_n_steps``, ``save_async``, ``checkpoint_on_sigterm``. process: the
    Accelerator's process view. gradient_state: which loader is iterating when an optimizer steps.
    prepared: what was prepared, counted against the checkpoint's contents. checkpointing: saves and
    loads. tracking: its logging progress is saved and resumed with the run. nonfinite_guard: its
    skip count is saved too (None without ``skip_nonfinite``). end_training: the Accelerator's, called
    before exiting on SIGTERM. settings: the run's settled record (``ACCEL_AUTO_RESUME`` when ``resume`` is None).
    """

    def __init__(
        self,
        resume: str | None,
        project_configuration: ProjectConfiguration,
        process: ProcessControl,
        gradient_state: GradientState,
        prepared: PreparedObjects,
        checkpointing: Checkpointing,
        tracking: Tracking,
        nonfinite_guard: NonFiniteGuard | None,
        end_training: Callable[[], None],
        settings: RunSettings,
    ) -> None:
        from_env = resume is None and settings.flag(env.AUTO_RESUME)
        if from_env:
            resume = "auto"
        if resume is not None and resume not in RESUME_MODES:
            raise ValueError(f"resume must be None or 'auto', got {resume!r}.")
        config = project_configuration
        wanted = "resume='auto'" if resume else "save_every_n_steps" if config.save_every_n_steps else None
        if wanted and not (config.automatic_checkpoint_naming and config.project_dir):
            source = f" ({env.AUTO_RESUME}=1, from accel launch --auto-resume)" if from_env else ""
            raise ValueError(
                f"{wanted}{source} works with automatic checkpoints: pass Accelerator(project_config="
                "ProjectConfiguration(project_dir='runs/exp', automatic_checkpoint_naming=True))."
            )
        self._project_configuration = config
        self._process = process
        self._gradient_state = gradient_state
        self._prepared = prepared
        self._checkpointing = checkpointing
        self._tracking = tracking
        self._nonfinite_guard = nonfinite_guard
        self._end_training = end_training
        self.resume: str | None = resume
        self.resumed_from: str | None = None
        self.completed_steps = 0
        self._resume_pending = resume == "auto"
        self._resume_point: Any = _UNKNOWN
        self._stepped_in: Any = _NO_STEP
        self._preemption: PreemptionWatch | None = None
        if config.checkpoint_on_sigterm:
            if not (config.automatic_checkpoint_naming and config.project_dir):
                raise ValueError(
                    "checkpoint_on_sigterm=True saves an automatic checkpoint: pass ProjectConfiguration("
                    "project_dir='runs/exp', automatic_checkpoint_naming=True, checkpoint_on_sigterm=True)."
                )
            self._preemption = PreemptionWatch(process._current_state.device)
        self.boundary_hook = StepBoundaryHook(self)

    # -- what a checkpoint keeps of the run (read and written by accel-checkpoint) --------------
    def training_progress(self) -> dict[str, Any]:
        """What ``save_state`` stores of the run besides the objects: optimizer steps, the last logged step and the
        trackers' runs, the skip count."""
        progress: dict[str, Any] = {"completed_steps": self.completed_steps, **self._tracking.progress()}
        if self._nonfinite_guard is not None:
            progress["nonfinite_skips"] = self._nonfinite_guard.state_dict()
        return progress

    def restore_training_progress(self, progress: dict[str, Any]) -> None:
        """Takes back what ``training_progress`` returned when the checkpoint was saved."""
        self.completed_steps = int(progress.get("completed_steps", 0))
        self._tracking.restore(progress)
        if self._nonfinite_guard is not None and "nonfinite_skips" in progress:  # absent: saved without the guard
            self._nonfinite_guard.load_state_dict(progress["nonfinite_skips"])
        self._stepped_in = _NO_STEP

    # -- resuming ---------------------------------------------------------------------------
    def resume_if_possible(self) -> str | None:
        """Loads the newest complete automatic checkpoint, if there is one; returns its folder (else None).
        Collective. The trackers continue the checkpoint's run."""
        self._resume_pending = False
        point = self._find_resume_point()
        if point is None:
            self._tracking.continue_from(None)  # an earlier attempt that never saved: its logged steps start over
            return None
        self._checkpointing.load_state(point.path)
        self.resumed_from = point.path
        self._tracking.continue_from(self._tracking.last_logged_step)
        if self._process._current_state.is_main_process:
            logger.info("Resumed from %s: %d optimizer steps done.", point.path, self.completed_steps)
        return point.path

    def _find_resume_point(self) -> ResumePoint | None:
        if self._resume_point is _UNKNOWN:
            self._resume_point = self._checkpointing.find_resume_point()  # collective: agreed by every process
        return self._resume_point

    def after_prepare(self) -> None:
        """Resumes (``resume="auto"``) once everything the checkpoint holds has been prepared or registered."""
        if not self._resume_pending:
            return
        point = self._find_resume_point()
        prepared = self._prepared
        have = {
            "models": len(prepared.models),
            "optimizers": len(prepared.optimizers),
            "schedulers": len(prepared.schedulers),
            "dataloaders": len(prepared.dataloaders),
            "custom_objects": len(prepared.custom_objects),
        }
        if point is None or all(count >= point.counts.get(kind, 0) for kind, count in have.items()):
            self.resume_if_possible()

    # -- step boundaries --------------------------------------------------------------------
    def optimizer_stepped(self) -> None:
        """A prepared optimizer really stepped (called by ``AcceleratedOptimizer.step``)."""
        if self._stepped_in is _NO_STEP:  # several optimizers stepping on one batch make one step
            loader = self._gradient_state.active_dataloader
            # The loader's next boundary ends the step if it reports to this Accelerator (the attribute of
            # protocols.ReportsBatchBoundaries, read without an isinstance check: this runs every step);
            # else (a plain DataLoader, one prepared elsewhere) the next accumulate() does.
            reports_here = getattr(loader, "batch_boundary_hook", None) is self.boundary_hook
            self._stepped_in = loader if reports_here else None
            self.completed_steps += 1

    def on_batch_boundary(self, dataloader: Any) -> None:
        """A loader this Accelerator prepared was asked for its next batch (``StepBoundaryHook``)."""
        if self._resume_pending:
            # Training started before everything the checkpoint holds was prepared: load_state names what differs.
            self.resume_if_possible()
        if self._stepped_in is not _NO_STEP and self._stepped_in is dataloader:
            self._finish_step(f"at a step boundary of its {type(dataloader).__name__}")

    def accumulate_boundary(self) -> None:
        """``accumulate()`` was entered: the boundary of loops that iterate no loader of this Accelerator."""
        if self._resume_pending:
            self.resume_if_possible()
        if self._stepped_in is None:
            self._finish_step("on entering accumulate()")

    def _finish_step(self, where: str) -> None:
        self._stepped_in = _NO_STEP
        config = self._project_configuration
        every = config.save_every_n_steps
        if self._preemption is not None and self._preemption.agreed():
            self._save_and_exit_on_preemption()
        if every and self.completed_steps % every == 0:
            path = self._checkpointing.save_state(None, async_save=config.save_async)
            if self._process._current_state.is_main_process:
                logger.info(
                    "Periodic checkpoint (save_every_n_steps=%d) after optimizer step %d, taken %s: %s%s",
                    every,
                    self.completed_steps,
                    where,
                    path,
                    " (written in the background)" if config.save_async else "",
                )

    def _save_and_exit_on_preemption(self) -> NoReturn:
        """Some process got SIGTERM (``checkpoint_on_sigterm``): every process saves this step, then exits 143."""
        is_main = self._process._current_state.is_main_process
        if is_main:
            logger.warning("SIGTERM received: saving a checkpoint at step %d before exiting.", self.completed_steps)
        self._checkpointing.wait()  # an asynchronous save still in flight must complete first
        path = self._checkpointing.save_state(None)  # synchronous: the process ends right after
        if is_main:
            logger.warning("Saved %s; exiting with %d (resume with resume='auto').", path, EXIT_CODE)
        self._end_training()  # flushes the trackers' buffered events (TensorBoard keeps some in memory)
        assert self._preemption is not None
        self._preemption.close()
        raise SystemExit(EXIT_CODE)


class StepBoundaryHook:
    """The ``protocols.BatchBoundaryHook`` an Accelerator gives each loader it prepares.

    Calls that Accelerator's ``Resumption.on_batch_boundary``: a periodic checkpoint due from the previous
    step is written there (see the module docstring). Holds the Resumption part weakly, so a loader kept
    after its Accelerator is gone does not keep the Accelerator (and its models) alive. A copy of the
    loader keeps the hook; a pickled loader (unpickled in another process, which has other
    Accelerators) arrives without one.
    """

    __slots__ = ("_resumption",)

    def __init__(self, resumption: Resumption) -> None:
        self._resumption = weakref.ref(resumption)

    def __call__(self, dataloader: Any) -> None:
        resumption = self._resumption()
        if resumption is not None:
            resumption.on_batch_boundary(dataloader)

    def __copy__(self) -> StepBoundaryHook:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> StepBoundaryHook:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_no_hook, ())


def _no_hook() -> None:
    """What an unpickled ``StepBoundaryHook`` becomes: no hook."""
    return None
