"""``DataLoaderDispatcher``: the reference's class of a dispatching prepared loader, for ``isinstance`` only.

Scripts written for Accelerate test ``isinstance(loader, DataLoaderDispatcher)`` to know whether
process 0 reads the batches and sends each process its part (``dispatch_batches``). accel prepares
one loader class for both modes (``DataLoaderShard``, or its StatefulDataLoader twin), so the check
asks the loader which mode it runs in. No torch import.
"""

from __future__ import annotations

from typing import Any, NoReturn


class _DispatchModeCheck(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        from .loader import ShardedLoaderMixin

        return isinstance(instance, ShardedLoaderMixin) and bool(instance.dispatch_batches)


class DataLoaderDispatcher(metaclass=_DispatchModeCheck):
    """A prepared loader in dispatch mode: ``isinstance(loader, DataLoaderDispatcher)`` is True for a loader that
    ``prepare`` / ``prepare_data_loader(dispatch_batches=True)`` made (``loader.dispatch_batches``).

    Not made directly: prepare the ``DataLoader`` with ``DataLoaderConfiguration(dispatch_batches=True)``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(
            "DataLoaderDispatcher is not made directly in accel: prepare a DataLoader with "
            "Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True)) or "
            "prepare_data_loader(loader, dispatch_batches=True); isinstance(prepared, DataLoaderDispatcher) is then "
            "True."
        )
