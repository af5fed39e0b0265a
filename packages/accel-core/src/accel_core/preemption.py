"""Emergency checkpoint on SIGTERM: a preempted job saves at the next step boundary, then exits.

Clusters announce a preemption with SIGTERM and kill a little later (torchrun's agent forwards the
signal to its workers and sends SIGKILL 30 s after; Kubernetes and SLURM give a configurable grace
time). With ``ProjectConfiguration(checkpoint_on_sigterm=True)`` the handler only notes the signal:
saving inside a signal handler could interrupt a collective or a half-applied optimizer step. At
the end of each optimizer step (where periodic saves are taken, so the state is complete) the
processes agree with one all_reduce of a flag, since the signal may have reached only some of them,
and every process then saves and exits with 128 + SIGTERM. A restart with ``resume="auto"``
continues from that checkpoint.

Cost while opted in: one all_reduce of one number per optimizer step. Nothing when not.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import torch

from .ops import any_process

EXIT_CODE = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class PreemptionWatch:
    """Notes SIGTERM and tells every process at once, at a step boundary, whether one of them got it."""

    def __init__(self, device: torch.device) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise ValueError(
                "checkpoint_on_sigterm=True installs a SIGTERM handler, which Python allows only in the main "
                "thread: create the Accelerator there, or turn the option off."
            )
        self.device = device
        self.requested = False
        self._previous: Any = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        # A handler the script installed before keeps running (it must not end the process itself:
        # the default action, which would, is what this watch replaces).
        if callable(self._previous):
            self._previous(signum, frame)

    def agreed(self) -> bool:
        """Collective: whether any process received SIGTERM (every process gets the same answer)."""
        return any_process(torch.tensor(1.0 if self.requested else 0.0, device=self.device))

    def close(self) -> None:
        """Puts the previous SIGTERM handler back."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
