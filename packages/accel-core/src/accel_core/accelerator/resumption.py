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

from .. import discovery
from .. import environment as env
from ..configuration import ProjectConfiguration
from ..preemption import EXIT_CODE, PreemptionWatch
from ..protocols import ContinuableTracker, RewindableTracker

if TYPE_CHECKING:
    from ..protocols import ResumePoint
    from ..state import AcceleratorState, GradientState
    from ..strategies import PreparedObjects
    from .nonfinite_guard import NonFiniteGuard

logger = logging.getLogger(__name__)

RESUME_MODES = ("auto",)
_NO_STEP = object()  # no optimizer step since the last boundary
_UNKNOWN = object()  # the resume point was not looked up yet


class Resumption:
    """Mixin of the Accelerator: ``resume="auto"``, ``completed_steps`` and ``save_every_n_steps``."""

    state: AcceleratorState
    gradient_state: GradientState
    project_configuration: ProjectConfiguration
    prepared: PreparedObjects
    trackers: list[Any]
    _nonfinite_guard: NonFiniteGuard | None
    save_state: Callable[..., str]
    load_state: Callable[..., str | None]
    wait_for_checkpoint: Callable[[], str | None]
    end_training: Callable[[], None]

    def _setup_resumption(self, resume: str | None) -> None:
        from_env = resume is None and env.flag(env.AUTO_RESUME)
        if from_env:
            resume = "auto"
        if resume is not None and resume not in RESUME_MODES:
            raise ValueError(f"resume must be None or 'auto', got {resume!r}.")
        config = self.project_configuration
        wanted = "resume='auto'" if resume else "save_every_n_steps" if config.save_every_n_steps else None
        if wanted and not (config.automatic_checkpoint_naming and config.project_dir):
            source = f" ({env.AUTO_RESUME}=1, from accel launch --auto-resume)" if from_env else ""
            raise ValueError(
                f"{wanted}{source} works with automatic checkpoints: pass Accelerator(project_config="
                "ProjectConfiguration(project_dir='runs/exp', automatic_checkpoint_naming=True))."
            )
        self.resume: str | None = resume
        self.resumed_from: str | None = None
        self.completed_steps = 0
        self._last_logged_step: int | None = None
        self._resume_pending = resume == "auto"
        self._resume_point: Any = _UNKNOWN
        self._stepped_in: Any = _NO_STEP
        self._tracker_rewind: tuple[int | None] | None = None
        self._tracker_runs: dict[str, str] = {}  # tracker name -> run id, from the loaded checkpoint
        self._preemption: PreemptionWatch | None = None
        if config.checkpoint_on_sigterm:
            if not (config.automatic_checkpoint_naming and config.project_dir):
                raise ValueError(
                    "checkpoint_on_sigterm=True saves an automatic checkpoint: pass ProjectConfiguration("
                    "project_dir='runs/exp', automatic_checkpoint_naming=True, checkpoint_on_sigterm=True)."
                )
            self._preemption = PreemptionWatch(self.state.device)
        self._batch_boundary_hook = StepBoundaryHook(self)

    # -- what a checkpoint keeps of the run (read and written by accel-checkpoint) --------------
    def training_progress(self) -> dict[str, Any]:
        """What ``save_state`` stores of the run besides the objects: optimizer steps and the last logged step."""
        progress: dict[str, Any] = {"completed_steps": self.completed_steps, "last_logged_step": self._last_logged_step}
        runs = {t.name: t.run_id for t in self.trackers if isinstance(t, ContinuableTracker) and t.run_id}
        if runs:  # the W&B / MLflow runs a resumed job continues (main process: the one with trackers)
            progress["tracker_runs"] = runs
        if self._nonfinite_guard is not None:
            progress["nonfinite_skips"] = self._nonfinite_guard.state_dict()
        return progress

    def restore_training_progress(self, progress: dict[str, Any]) -> None:
        """Called by ``load_state`` with what ``training_progress`` returned when the checkpoint was saved."""
        self.completed_steps = int(progress.get("completed_steps", 0))
        if "last_logged_step" in progress:
            self._last_logged_step = progress["last_logged_step"]
        self._tracker_runs = dict(progress.get("tracker_runs", {}))
        if self._nonfinite_guard is not None and "nonfinite_skips" in progress:  # absent: saved without the guard
            self._nonfinite_guard.load_state_dict(progress["nonfinite_skips"])
        self._stepped_in = _NO_STEP

    # -- resuming ---------------------------------------------------------------------------
    def resume_if_possible(self) -> str | None:
        """Loads the newest complete automatic checkpoint, if there is one; returns its folder (else None).

        ``resume="auto"`` calls it once everything the checkpoint holds is prepared; call it
        yourself (after your last ``prepare``) to resume without that switch. Collective: every
        process calls it. The trackers continue the checkpoint's run: the local and TensorBoard
        trackers drop what was logged after it (with no checkpoint: everything an earlier attempt
        logged with a step), so each step is logged once.

        Example::

            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            if accelerator.resume_if_possible():
                accelerator.print(f"resumed at step {accelerator.completed_steps}")
        """
        self._resume_pending = False
        point = self._find_resume_point()
        if point is None:
            self._rewind_trackers(None)  # an earlier attempt that never saved: its logged steps start over
            return None
        self.load_state(point.path)
        self.resumed_from = point.path
        self._rewind_trackers(self._last_logged_step)
        if self.state.is_main_process:
            logger.info("Resumed from %s: %d optimizer steps done.", point.path, self.completed_steps)
        return point.path

    def _find_resume_point(self) -> ResumePoint | None:
        if self._resume_point is _UNKNOWN:
            handler = discovery.load("accel.checkpoint", "state")
            self._resume_point = handler.find_resume_point(self)  # collective: agreed by every process
        return self._resume_point

    def _after_prepare(self) -> None:
        """Resumes (``resume="auto"``) once everything the checkpoint holds has been prepared or registered."""
        if not self._resume_pending:
            return
        point = self._find_resume_point()
        prepared = self.prepared
        have = {
            "models": len(prepared.models),
            "optimizers": len(prepared.optimizers),
            "schedulers": len(prepared.schedulers),
            "dataloaders": len(prepared.dataloaders),
            "custom_objects": len(prepared.custom_objects),
        }
        if point is None or all(count >= point.counts.get(kind, 0) for kind, count in have.items()):
            self.resume_if_possible()

    def _rewind_trackers(self, last_step: int | None) -> None:
        self._tracker_rewind = (last_step,)
        if self.trackers:
            self._apply_tracker_rewind()

    def _apply_tracker_rewind(self) -> None:
        """Tells started trackers where the resumed run continues (called again by ``init_trackers``)."""
        if self._tracker_rewind is None:
            return
        (last_step,) = self._tracker_rewind
        self._tracker_rewind = None
        for tracker in self.trackers:
            if isinstance(tracker, ContinuableTracker) and tracker.name in self._tracker_runs:
                tracker.continue_run(self._tracker_runs[tracker.name], last_step)
            elif isinstance(tracker, RewindableTracker):
                tracker.rewind(last_step)

    # -- step boundaries --------------------------------------------------------------------
    def _optimizer_stepped(self) -> None:
        """A prepared optimizer really stepped (called by ``AcceleratedOptimizer.step``)."""
        if self._stepped_in is _NO_STEP:  # several optimizers stepping on one batch make one step
            loader = self.gradient_state.active_dataloader
            # The loader's next boundary ends the step if it reports to this Accelerator (the attribute of
            # protocols.ReportsBatchBoundaries, read without an isinstance check: this runs every step);
            # else (a plain DataLoader, one prepared elsewhere) the next accumulate() does.
            reports_here = getattr(loader, "batch_boundary_hook", None) is self._batch_boundary_hook
            self._stepped_in = loader if reports_here else None
            self.completed_steps += 1

    def _on_batch_boundary(self, dataloader: Any) -> None:
        """A loader this Accelerator prepared was asked for its next batch (``StepBoundaryHook``)."""
        if self._resume_pending:
            # Training started before everything the checkpoint holds was prepared: load_state names what differs.
            self.resume_if_possible()
        if self._stepped_in is not _NO_STEP and self._stepped_in is dataloader:
            self._finish_step(f"at a step boundary of its {type(dataloader).__name__}")

    def _accumulate_boundary(self) -> None:
        """``accumulate()`` was entered: the boundary of loops that iterate no loader of this Accelerator."""
        if self._resume_pending:
            self.resume_if_possible()
        if self._stepped_in is None:
            self._finish_step("on entering accumulate()")

    def _finish_step(self, where: str) -> None:
        self._stepped_in = _NO_STEP
        config = self.project_configuration
        every = config.save_every_n_steps
        if self._preemption is not None and self._preemption.agreed():
            self._save_and_exit_on_preemption()
        if every and self.completed_steps % every == 0:
            path = self.save_state(async_save=config.save_async)
            if self.state.is_main_process:
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
        if self.state.is_main_process:
            logger.warning("SIGTERM received: saving a checkpoint at step %d before exiting.", self.completed_steps)
        self.wait_for_checkpoint()  # an asynchronous save still in flight must complete first
        path = self.save_state()  # synchronous: the process ends right after
        if self.state.is_main_process:
            logger.warning("Saved %s; exiting with %d (resume with resume='auto').", path, EXIT_CODE)
        self.end_training()  # flushes the trackers' buffered events (TensorBoard keeps some in memory)
        assert self._preemption is not None
        self._preemption.close()
        raise SystemExit(EXIT_CODE)


class StepBoundaryHook:
    """The ``protocols.BatchBoundaryHook`` an Accelerator gives each loader it prepares.

    Calls that Accelerator's ``_on_batch_boundary``: a periodic checkpoint due from the previous step
    is written there (see the module docstring). Holds the Accelerator weakly, so a loader kept after
    its Accelerator is gone does not keep the Accelerator (and its models) alive. A copy of the
    loader keeps the hook; a pickled loader (unpickled in another process, which has other
    Accelerators) arrives without one.
    """

    __slots__ = ("_accelerator",)

    def __init__(self, accelerator: Resumption) -> None:
        self._accelerator = weakref.ref(accelerator)

    def __call__(self, dataloader: Any) -> None:
        accelerator = self._accelerator()
        if accelerator is not None:
            accelerator._on_batch_boundary(dataloader)

    def __copy__(self) -> StepBoundaryHook:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> StepBoundaryHook:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_no_hook, ())


def _no_hook() -> None:
    """What an unpickled ``StepBoundaryHook`` becomes: no hook."""
    return None
