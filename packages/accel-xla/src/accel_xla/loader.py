"""The prepared dataloader on XLA: accel-data's sharded loader read through torch-xla's ``MpDeviceLoader``.

``MpDeviceLoader`` reads the wrapped loader on background threads and uploads the next batches
while the device computes; each batch it hands out marks an XLA step first (the graph recorded for
the previous batch runs). Its threads read ahead, so what the wrapped loader reports *now* (end of
the data, position for a checkpoint) is about a later batch than the one the training loop holds.
So each batch travels with a ticket: the reading thread notes, as the wrapped loader yields it,
whether it is the last one, the real samples of the last step and the loader's ``state_dict``;
the loop's side answers from the ticket of the batch it received. For the same reason the step
boundaries (where the Accelerator takes its periodic checkpoints, a collective) are the loop's:
the wrapper takes the wrapped loader's ``batch_boundary_hook`` over and calls it on the loop's thread.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from accel_core.protocols import ReportsBatchBoundaries
from accel_core.state import GradientState

from .runtime import TorchXla, require_torch_xla

if TYPE_CHECKING:
    from accel_core.protocols import BatchBoundaryHook


@dataclass(frozen=True)
class _Ticket:
    end_of_dataloader: bool
    remainder: int
    state: dict[str, Any] | None


class _Ticketed:
    """The wrapped loader as the reading thread sees it: each batch paired with a ticket number (an int, which
    the device upload leaves as it is)."""

    def __init__(self, owner: XlaDeviceLoader) -> None:
        self.owner = owner

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        loader = self.owner.dataloader
        has_state = callable(getattr(loader, "state_dict", None))
        for batch in loader:
            ticket = _Ticket(
                bool(getattr(loader, "end_of_dataloader", False)),
                int(getattr(loader, "remainder", -1)),
                loader.state_dict() if has_state else None,
            )
            yield batch, self.owner._issue(ticket)

    def __len__(self) -> int:
        return len(self.owner.dataloader)


class XlaDeviceLoader:
    """Iterates ``dataloader`` (a prepared loader leaving batches on the CPU) with its batches on ``device``.

    Arguments not obvious:
        parallel_loader_kwargs: passed to torch-xla's ``MpDeviceLoader`` (``loader_prefetch_size``,
            ``device_prefetch_size``, ``host_to_device_transfer_threads``, ...).

    Attributes read by ``GradientState`` while iterating: ``end_of_dataloader`` and ``remainder``,
    about the batch the loop holds. ``batch_boundary_hook``: the wrapped loader's, taken over (see
    ``accel_core.protocols.ReportsBatchBoundaries``) and called before each batch the loop asks for
    and after the epoch, as the wrapped loader would have. Everything else (``batch_size``,
    ``dataset``, ``set_epoch``, ...) is the wrapped loader's.

    Example::

        loader = XlaDeviceLoader(accel_data_loader, torch_xla.device())
        for batch in loader:  # tensors on the XLA device
            ...
    """

    def __init__(
        self, dataloader: Any, device: torch.device, xla: TorchXla | None = None, **parallel_loader_kwargs: Any
    ) -> None:
        self._xla = xla if xla is not None else require_torch_xla()
        self.dataloader = dataloader
        self.device = device
        self.batch_boundary_hook: BatchBoundaryHook | None = None
        if isinstance(dataloader, ReportsBatchBoundaries):  # read on torch-xla's threads: its boundaries are ours
            self.batch_boundary_hook, dataloader.batch_boundary_hook = dataloader.batch_boundary_hook, None
        self._current: _Ticket | None = None
        self._tickets: dict[int, _Ticket] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._device_loader = self._xla.pl.MpDeviceLoader(_Ticketed(self), device, **parallel_loader_kwargs)

    def _issue(self, ticket: _Ticket) -> int:
        with self._lock:
            number = next(self._numbers)
            self._tickets[number] = ticket
        return number

    def _redeem(self, number: int) -> _Ticket:
        with self._lock:
            return self._tickets.pop(number)

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the batch the loop holds is the last one of the epoch."""
        return self._current is not None and self._current.end_of_dataloader

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch while ``end_of_dataloader`` is True, else -1."""
        return self._current.remainder if self.end_of_dataloader and self._current is not None else -1

    def __iter__(self) -> Iterator[Any]:
        gradient_state = GradientState()
        boundary = self.batch_boundary_hook
        if boundary is not None:  # before the ticket of a loop that stopped early is dropped: state_dict reads it
            boundary(self)
        self._current = None
        with self._lock:
            self._tickets.clear()
        batches = iter(self._device_loader)
        registered = False
        completed = False
        try:
            for batch, number in batches:
                if registered and boundary is not None:  # the loop asks for the next batch: the last one's step is done
                    boundary(self)
                self._current = self._redeem(int(number))
                if not registered:
                    # After the first batch: by then the wrapped loader (started on the reading thread) has
                    # registered itself, so this wrapper is the innermost active loader in GradientState.
                    gradient_state.register_dataloader(self)
                    registered = True
                yield batch
            # The whole epoch was read: the wrapped loader's own position (the next epoch) is the right one now.
            self._current = None
            completed = True
        finally:
            # A loop that stopped early (break) keeps the ticket of the last batch it received, for state_dict.
            if registered:
                gradient_state.unregister_dataloader(self)
        if completed and boundary is not None:  # the epoch's end: a checkpoint here resumes at the next epoch
            boundary(self)

    def __len__(self) -> int:
        return len(self.dataloader)

    def set_epoch(self, epoch: int) -> None:
        """Sets the wrapped loader's epoch (its sampler's shuffle order)."""
        self.dataloader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's position after the batch the loop holds (not after the batches read ahead)."""
        if self._current is not None and self._current.state is not None:
            return self._current.state
        return self.dataloader.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the wrapped loader's position."""
        self.dataloader.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        # The rest of the prepared loader's face (batch_size, dataset, sampler, total_batch_size, ...).
        if name.startswith("_") or name == "dataloader":
            raise AttributeError(name)
        return getattr(self.dataloader, name)
