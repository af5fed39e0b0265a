"""``accel plot RUN``: a run's metrics (the local tracker's ``metrics.jsonl``) drawn as a PNG.

The command of ``accel_tracking.plot_metrics``; matplotlib (``accel-tracking[plot]``) is imported only here.
"""

from __future__ import annotations

from accel_tracking.plot import main as plot_main


def main(argv: list[str]) -> int:
    return plot_main(argv, prog="accel plot")
