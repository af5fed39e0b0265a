"""The digest the frameworks scenarios compare weights by (scenarios.py, diffusers_loop.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def digest(parameters: Iterable[torch.Tensor]) -> str:
    """A digest of the bytes of ``parameters`` (in order): equal digests, equal weights bit for bit."""
    hasher = hashlib.sha256()
    for parameter in parameters:
        hasher.update(parameter.detach().to("cpu").contiguous().float().numpy().tobytes())
    return hasher.hexdigest()[:16]
