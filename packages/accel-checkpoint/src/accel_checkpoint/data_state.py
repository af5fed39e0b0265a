"""Dataloader positions.

A prepared loader that has ``state_dict`` / ``load_state_dict`` (accel-data's does: epoch, batches
already yielded, sampler seed and generator) is saved and restored through them: ``load_state``
puts the loader back mid-epoch and the next iteration continues with the next batch.

A loader without them (a plain DataLoader registered by other means) cannot report where it is.
What it does expose is saved (the sampler's epoch and random generator, so the shuffle order of
the epoch is the same again); the position is then restored by the script with
``accelerator.skip_first_batches(loader, n)``, ``n`` being the number of batches it had consumed.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import CheckpointMismatchError


def _generators(loader: Any) -> list[tuple[str, torch.Generator]]:
    found = []
    for owner_name in ("sampler", "batch_sampler"):
        owner = getattr(loader, owner_name, None)
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            found.append((owner_name, generator))
        inner = getattr(owner, "sampler", None)  # a BatchSampler's sampler
        generator = getattr(inner, "generator", None)
        if isinstance(generator, torch.Generator):
            found.append((f"{owner_name}.sampler", generator))
    generator = getattr(loader, "generator", None)
    if isinstance(generator, torch.Generator):
        found.append(("loader", generator))
    return found


def dataloader_state(loader: Any) -> dict[str, Any]:
    """What can be saved of ``loader``'s position (plain data, safe to load)."""
    if callable(getattr(loader, "state_dict", None)):
        return {"kind": "state_dict", "state": loader.state_dict()}
    state: dict[str, Any] = {"kind": "fallback", "generators": {name: g.get_state() for name, g in _generators(loader)}}
    epoch = getattr(getattr(loader, "sampler", None), "epoch", None)
    if isinstance(epoch, int):
        state["epoch"] = epoch
    return state


def restore_dataloader_state(loader: Any, saved: dict[str, Any], where: str) -> None:
    if saved.get("kind") == "state_dict":
        if not callable(getattr(loader, "load_state_dict", None)):
            raise CheckpointMismatchError(
                f"{where} holds a dataloader state_dict, but the dataloader prepared now has no load_state_dict; "
                "prepare the same kind of dataloader as when saving (accel-data's prepared loader)."
            )
        loader.load_state_dict(saved["state"])
        return
    generators = dict(_generators(loader))
    for name, value in saved.get("generators", {}).items():
        if name in generators:
            generators[name].set_state(value)
    set_epoch = getattr(getattr(loader, "sampler", None), "set_epoch", None)
    if "epoch" in saved and callable(set_epoch):
        set_epoch(saved["epoch"])
