"""``GradientState``: gradient accumulation bookkeeping and the prepared dataloaders' end-of-data signal."""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from ..configuration import GradientAccumulationPlugin


class IteratingDataLoader(Protocol):
    """What a loader registered with ``GradientState`` answers while it iterates (accel-data's prepared loader,
    accel-xla's device loader, and Accelerate's ``DataLoaderShard`` alike)."""

    @property
    def end_of_dataloader(self) -> bool:
        """True while the last batch of the epoch is being yielded."""
        ...

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch (-1 when unknown)."""
        ...


_GRADIENT_SETTINGS = frozenset(
    {"sync_gradients", "num_steps", "sync_with_dataloader", "sync_each_batch", "adjust_scheduler_given"}
)


def _restore_gradient_state(settings: dict[str, Any]) -> GradientState:
    fresh = not GradientState._shared_state
    state = GradientState()
    if fresh:
        state._shared_state.update(settings)
    return state


class GradientState:
    """Gradient accumulation bookkeeping and the prepared dataloaders' end-of-data signal.

    Shared by every instance in the process. A prepared dataloader registers itself while it
    iterates (``register_dataloader`` / ``unregister_dataloader``); the innermost active one answers
    ``end_of_dataloader`` and ``remainder``. Step boundaries (periodic checkpoints) do not pass through
    here: each Accelerator hands its own loaders a ``protocols.BatchBoundaryHook``.
    """

    _shared_state: ClassVar[dict[str, Any]] = {}

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        self.__dict__ = self._shared_state
        if not self._shared_state:
            self.sync_gradients = True
            self.active_dataloader: IteratingDataLoader | None = None
            self.dataloader_references: list[IteratingDataLoader] = []
            self.num_steps = 1
            self.sync_with_dataloader = True
            self.sync_each_batch = False
            self.adjust_scheduler_given = True
        if gradient_accumulation_plugin is not None:  # a new Accelerator starts a fresh accumulation cycle
            self.sync_gradients = True
            self.num_steps = gradient_accumulation_plugin.num_steps
            self.sync_with_dataloader = gradient_accumulation_plugin.sync_with_dataloader
            self.sync_each_batch = gradient_accumulation_plugin.sync_each_batch
            self.adjust_scheduler_given = gradient_accumulation_plugin.adjust_scheduler

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n"
        )

    @property
    def initialized(self) -> bool:
        """Whether the gradient state has been set up in this process."""
        return bool(self._shared_state)

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The accumulation settings that differ from ``GradientAccumulationPlugin``'s defaults (its
        ``to_kwargs()``), as the reference keeps them."""
        return GradientAccumulationPlugin(
            num_steps=self.num_steps,
            adjust_scheduler=self.adjust_scheduler_given,
            sync_with_dataloader=self.sync_with_dataloader,
            sync_each_batch=self.sync_each_batch,
        ).to_kwargs()

    @property
    def adjust_scheduler(self) -> bool:
        """``plugin_kwargs.get("adjust_scheduler", False)``, as the reference reads it: the plugin's default
        (True) is left out of ``plugin_kwargs``, so this is False either way. The scheduler never steps on
        accumulation micro-steps, whatever the plugin says (``GradientAccumulationPlugin``)."""
        return bool(self.plugin_kwargs.get("adjust_scheduler", False))

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the active prepared dataloader is yielding its last batch."""
        return self.active_dataloader is not None and bool(self.active_dataloader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch of the active dataloader (-1 when unknown)."""
        return -1 if self.active_dataloader is None else self.active_dataloader.remainder

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared dataloader is being iterated."""
        return self.active_dataloader is not None

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self.sync_gradients = sync_gradients

    def register_dataloader(self, dataloader: IteratingDataLoader) -> None:
        """A prepared loader starts handing out batches: it answers ``end_of_dataloader`` and ``remainder``
        until ``unregister_dataloader``. Loaders iterated inside another one's loop (an evaluation loop
        during training) stack: the innermost answers, and the outer one again once it is unregistered."""
        self.active_dataloader = dataloader
        self.dataloader_references.append(dataloader)

    def unregister_dataloader(self, dataloader: IteratingDataLoader) -> None:
        """The loader's iteration ended or was abandoned (call it in a ``finally``)."""
        if dataloader in self.dataloader_references:
            self.dataloader_references.remove(dataloader)
        self.active_dataloader = self.dataloader_references[-1] if self.dataloader_references else None

    # The reference's names, which loaders written for Accelerate call.
    _add_dataloader = register_dataloader
    _remove_dataloader = unregister_dataloader

    @classmethod
    def _reset_state(cls) -> None:
        cls._shared_state.clear()

    # One per process, like PartialState: copies are the same object; unpickling gives the
    # receiving process's own, set from the sender's settings when it has none (its dataloaders
    # are not sent along).
    def __reduce__(self) -> tuple[Any, ...]:
        settings = {k: v for k, v in self._shared_state.items() if k in _GRADIENT_SETTINGS}
        return (_restore_gradient_state, (settings,))

    def __copy__(self) -> GradientState:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> GradientState:
        return self
