"""A tqdm progress bar that only the main process of each machine draws."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .base import local_process_index, process_index


def progress_bar(iterable: Iterable[Any] | None = None, *, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm(iterable, **kwargs)``, disabled on every process but the main one of each machine.

    With N processes per machine, N bars would overwrite each other in one terminal; one bar per
    machine (local rank 0) is what a user watches. ``main_process_only=False`` draws on every
    process (each bar is then labelled with its rank).

    Example::

        for batch in progress_bar(train_dataloader, desc="epoch 1"):
            ...
    """
    from tqdm import tqdm  # a dependency of accel-tracking; imported on first use (accel's imports stay light)

    if main_process_only:
        kwargs["disable"] = bool(kwargs.get("disable", False)) or local_process_index() != 0
    else:
        kwargs.setdefault("desc", f"[rank {process_index()}]")
    return tqdm(iterable, **kwargs)


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """The reference's ``accelerate.utils.tqdm``: ``tqdm.auto.tqdm(*args, **kwargs)``, drawn by local rank 0 only.

    ``main_process_only=False`` draws on every process; ``disable=True`` hides it everywhere.

    Example::

        from accel.utils import tqdm

        for batch in tqdm(train_dataloader, desc="epoch 1"):
            ...
    """
    if args and isinstance(args[0], bool):
        raise ValueError(
            "Passing `True` or `False` as the first argument to accel's `tqdm` wrapper is unsupported. "
            "Please use the `main_process_only` keyword argument instead."
        )
    from tqdm.auto import tqdm as auto_tqdm

    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = local_process_index() != 0
    return auto_tqdm(*args, **kwargs, disable=disable)
