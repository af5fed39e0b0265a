"""Loading an optimizer's state into the tensors it already holds.

``torch.load`` puts every tensor in freshly allocated memory, and the kernel then has to fault in
and zero each page of it: for 512 MB of Adam moments that is 131k page faults, about half of the
load time measured in ``bench/checkpoint_io.py``. When the optimizer already has state (a reload
in the middle of a run, or after a warm-up step), the file is memory-mapped instead and each saved
tensor is copied into the optimizer's own tensor of the same shape and dtype: the bytes are copied
once, into memory that is already mapped. A freshly built optimizer (no state yet) takes the plain
``torch.load`` path, since there is nothing to copy into.

Either way nothing stays backed by the file afterwards: a saved tensor with no counterpart is
copied into new memory. Reading stays ``weights_only`` (see ``safe_load``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CheckpointMismatchError
from .safe_load import load_torch_file

if TYPE_CHECKING:
    import torch


@dataclass
class SavedOptimizerState:
    """What ``read_optimizer_state`` read; ``mapped`` when its tensors are still views of the file."""

    state: Any
    mapped: bool


def _live_state(optimizer: torch.optim.Optimizer) -> dict[Any, dict[str, Any]]:
    """The optimizer's current per-parameter state, keyed as in its state_dict (no copies made)."""
    try:
        state = optimizer.state_dict().get("state", {})
    except Exception:  # noqa: BLE001 - an optimizer whose state_dict cannot be taken: plain load
        return {}
    return state if isinstance(state, dict) else {}


def optimizer_class(optimizer: Any) -> str:
    """The qualified class name of the user's optimizer inside a prepared one (``torch.optim.adam.Adam``)."""
    from accel_core.optimizer import unwrap_optimizer

    raw = type(unwrap_optimizer(optimizer))
    return f"{raw.__module__}.{raw.__qualname__}"


def check_optimizer_class(optimizer: Any, saved_class: str | None, path: str) -> None:
    """Raises ``CheckpointMismatchError`` naming both classes when ``path`` was saved for another optimizer class.

    saved_class: from the checkpoint's metadata; None (older checkpoints) skips the check.
    """
    current = optimizer_class(optimizer)
    if saved_class is not None and saved_class != current:
        raise CheckpointMismatchError(
            f"{path} holds the state of a {saved_class} optimizer, but the optimizer prepared in its place is a "
            f"{current}. Build the same optimizer class as the run that saved it (the states differ: torch would "
            "fail with a KeyError on a missing hyperparameter)."
        )


def read_optimizer_state(
    optimizer: torch.optim.Optimizer, path: str, allow_unsafe_pickle: bool | None = None
) -> SavedOptimizerState:
    """Reads an optimizer file; memory-mapped when the optimizer has state to copy into."""
    mapped = bool(_live_state(optimizer))
    return SavedOptimizerState(load_torch_file(path, allow_unsafe_pickle, mmap=mapped), mapped)


def _same_layout(saved: dict[str, Any], live: dict[str, Any]) -> bool:
    """The checks ``Optimizer.load_state_dict`` makes first: same groups, same number of parameters."""
    saved_groups, live_groups = saved.get("param_groups"), live.get("param_groups")
    if not isinstance(saved_groups, list) or not isinstance(live_groups, list) or len(saved_groups) != len(live_groups):
        return False
    return all(
        len(a.get("params", ())) == len(b.get("params", ())) for a, b in zip(saved_groups, live_groups, strict=True)
    )


def _copy_into_live(saved: dict[str, Any], live: dict[Any, dict[str, Any]]) -> tuple[dict[str, Any], set[int]]:
    """``saved`` with each tensor replaced by the live tensor it was copied into, where one matches;
    and the ids of the tensors so placed."""
    import torch

    state, placed = {}, set()
    for key, entries in saved.get("state", {}).items():
        current = live.get(key, {})
        merged = dict(entries)
        for name, value in entries.items():
            target = current.get(name)
            if (
                isinstance(value, torch.Tensor)
                and isinstance(target, torch.Tensor)
                and target.shape == value.shape
                and target.dtype == value.dtype
            ):
                with torch.no_grad():
                    target.copy_(value)
                merged[name] = target
                placed.add(id(target))
        state[key] = merged
    return {**saved, "state": state}, placed


def _materialize(obj: Any, placed: set[int], memo: dict[tuple[Any, ...], Any]) -> Any:
    """Copies every tensor still backed by the mapped file (not in ``placed``) into memory of its own.

    Identical views stay identical (one copy per storage view), as ``torch.load`` keeps them.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        if id(obj) in placed:
            return obj
        key = (obj.untyped_storage().data_ptr(), obj.storage_offset(), tuple(obj.shape), tuple(obj.stride()), obj.dtype)
        if key not in memo:
            memo[key] = obj.clone()
        return memo[key]
    if isinstance(obj, dict):
        return {k: _materialize(v, placed, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_materialize(v, placed, memo) for v in obj)
    return obj


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: SavedOptimizerState) -> None:
    """``optimizer.load_state_dict``, reusing the optimizer's own tensors for the saved ones.

    Writes into the optimizer's tensors: call it only once every process has read its files.
    """
    state = saved.state
    if saved.mapped:
        placed: set[int] = set()
        live = optimizer.state_dict()
        if isinstance(state, dict) and live.get("state") and _same_layout(state, live):
            state, placed = _copy_into_live(state, live["state"])
        state = _materialize(state, placed, {})
    optimizer.load_state_dict(state)
