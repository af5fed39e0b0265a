"""The Accelerator's process-control and collective methods: thin, documented forwards to the state and ops.

``ProcessControl`` is a read-only base class of the Accelerator: it holds no field, and reads only
``_current_state``, which the Accelerator provides (the state, refusing once it was reset after the Accelerator
was made). The
Accelerator's parts that need to know who this process is are handed the Accelerator as a
``ProcessControl``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import ops

if TYPE_CHECKING:
    import torch

    from ..state import AcceleratorState


class ProcessControl:
    """Base of the Accelerator: who am I, wait for the others, run on one process, collectives."""

    @property
    def _current_state(self) -> AcceleratorState:
        """The process's ``AcceleratorState``, refusing once it was reset after this Accelerator was made (provided
        by the Accelerator)."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """The device this process computes on (``cuda:<local rank>``, ``cpu``, ...)."""
        return self._current_state.device

    @property
    def num_processes(self) -> int:
        """The number of processes of the job (all machines)."""
        return self._current_state.num_processes

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return self._current_state.process_index

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine."""
        return self._current_state.local_process_index

    @property
    def use_distributed(self) -> bool:
        """Whether the job has more than one process."""
        return self._current_state.use_distributed

    @property
    def is_main_process(self) -> bool:
        """Whether this is global rank 0 (the one that writes logs and files)."""
        return self._current_state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is rank 0 of its machine."""
        return self._current_state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        """Whether this is the last global rank."""
        return self._current_state.is_last_process

    def wait_for_everyone(self) -> None:
        """Blocks until every process reaches this line (e.g. before the main process saves)."""
        self._current_state.wait_for_everyone()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """``with accelerator.main_process_first(): ...`` runs the block on the main process, then the others."""
        return self._current_state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Like ``main_process_first`` but per machine."""
        return self._current_state.local_main_process_first()

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        """``with accelerator.split_between_processes(items) as mine: ...`` — see
        ``PartialState.split_between_processes``."""
        return self._current_state.split_between_processes(inputs, apply_padding=apply_padding)

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run only on the main process."""
        return self._current_state.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run only on the first process of each machine."""
        return self._current_state.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: run only on the last process."""
        return self._current_state.on_last_process(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        """Decorator: run only on process ``process_index``."""
        return self._current_state.on_process(function, process_index=process_index)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        """Decorator: run only on the process with local index ``local_process_index``."""
        return self._current_state.on_local_process(function, local_process_index=local_process_index)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine."""
        self._current_state.print(*args, **kwargs)

    # -- collectives ------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenates ``tensor`` (or a nested structure of tensors) from all processes on dim 0."""
        return ops.gather(tensor)

    def gather_object(self, obj: Any) -> list[Any]:
        """Gathers picklable objects from all processes."""
        return ops.gather_object(obj)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduces tensors across processes (default ``"sum"``, as Accelerate's ``Accelerator.reduce``;
        also ``"mean"``, ``"max"``, ``"min"``, ``"product"``, ``"none"``); every process gets the result."""
        return ops.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Pads tensors along ``dim`` to the largest size across processes, so they can be gathered."""
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)
