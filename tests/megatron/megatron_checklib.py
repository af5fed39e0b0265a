"""What pp_checks.py and tp_checks.py (torchrun check scripts of this folder) both use: the rank, and ``raises``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch.distributed as dist
from checklist import expect


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])


@contextlib.contextmanager
def raises(kind: type[BaseException], text: str) -> Iterator[None]:
    """The block raises ``kind`` with ``text`` in its message."""
    try:
        yield
    except kind as error:
        expect(text in str(error), f"expected {text!r} in: {error}")
        return
    raise AssertionError(f"[rank {rank()}] expected {kind.__name__} ({text!r})")
