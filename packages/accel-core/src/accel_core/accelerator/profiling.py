"""The Accelerator's profiler: ``torch.profiler`` around a block, a Chrome trace per process."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..configuration import ProfileKwargs

if TYPE_CHECKING:
    from ..state import AcceleratorState

# One trace file per process in ``output_trace_dir`` (Accelerate's name).
PROFILE_PATTERN_NAME = "profile_{suffix}.json"


class Profiling:
    """Mixin of the Accelerator: ``with accelerator.profile() as prof:``."""

    state: AcceleratorState
    handlers: dict[type, Any]

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """Profiles the block with ``torch.profiler`` and yields the profiler.

        profile_handler: the settings; default the ``ProfileKwargs`` given in ``kwargs_handlers``,
            else torch's defaults. With ``output_trace_dir`` set, each process writes
            ``profile_<process index>.json`` there when the block ends, then waits for the others.

        Example::

            with accelerator.profile(ProfileKwargs(activities=["cpu"], output_trace_dir="traces")) as prof:
                train_step()
            accelerator.print(prof.key_averages().table(row_limit=10))
        """
        handler = profile_handler or self.handlers.get(ProfileKwargs) or ProfileKwargs()
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        name = PROFILE_PATTERN_NAME.format(suffix=self.state.process_index)
        profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, name))
        self.state.wait_for_everyone()
