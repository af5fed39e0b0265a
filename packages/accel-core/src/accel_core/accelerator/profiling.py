"""The Accelerator's profiler: ``torch.profiler`` around a block, a Chrome trace per process."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..configuration import ProfileKwargs
    from .process_control import ProcessControl

# One trace file per process in ``output_trace_dir`` (Accelerate's name).
PROFILE_PATTERN_NAME = "profile_{suffix}.json"


@contextlib.contextmanager
def profiled(handler: ProfileKwargs, process: ProcessControl) -> Iterator[Any]:
    """Profiles the block with the profiler ``handler`` builds and yields it (``Accelerator.profile``).

    With ``handler.output_trace_dir`` set, each process writes ``profile_<process index>.json`` there
    when the block ends, then waits for the others.
    """
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    name = PROFILE_PATTERN_NAME.format(suffix=process.process_index)
    profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, name))
    process.wait_for_everyone()
