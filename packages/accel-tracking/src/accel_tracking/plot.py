"""Draws the local tracker's metrics as a PNG, so a run can be looked at without any server."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import is_number, require
from .local import METRICS_FILE, RESERVED, read_metrics


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for index, record in enumerate(records):
        value = record.get(key)
        if not is_number(value) or not math.isfinite(value):
            continue
        step = record.get("step")
        xs.append(step if is_number(step) else index)  # unstepped logs plot in the order written
        ys.append(float(value))
    return xs, ys


def plot_metrics(
    run: str | os.PathLike[str],
    keys: Sequence[str] | None = None,
    out_png: str | os.PathLike[str] | None = None,
    *,
    title: str | None = None,
    log_y: bool = False,
) -> Path:
    """Plots ``keys`` (default: every numeric metric) of a local run, one panel per metric.

    ``run`` is a LocalTracker run folder or its ``metrics.jsonl``; the PNG goes to ``out_png``
    (default ``<run folder>/metrics.png``). Uses matplotlib's Agg backend, so it works without a
    display. Needs ``accel-tracking[plot]``. Returns the path written.

    Example::

        plot_metrics("runs/my_run", keys=["loss"], out_png="loss.png")
    """
    require("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    run = Path(run)
    run_dir = run if run.is_dir() else run.parent
    records = read_metrics(run)
    if keys is None:
        found: dict[str, None] = {}
        for record in records:
            found.update({k: None for k, v in record.items() if k not in RESERVED and is_number(v)})
        keys = list(found)
    else:
        keys = [keys] if isinstance(keys, str) else list(keys)
    if not keys:
        raise ValueError(f"No numeric metrics to plot in {run_dir / METRICS_FILE}.")
    series = {key: _series(records, key) for key in keys}
    missing = [key for key, (xs, _) in series.items() if not xs]
    if missing:
        raise ValueError(
            f"No numeric values of {missing} in {run_dir / METRICS_FILE}; logged keys: "
            f"{sorted({k for r in records for k in r} - set(RESERVED))}."
        )

    # A Figure with its own Agg canvas (not pyplot): no global state, no display, thread-safe.
    figure = Figure(figsize=(7, 2.6 * len(keys)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(keys), 1, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys, strict=True):
        xs, ys = series[key]
        ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3, linewidth=1.5)
        ax.set_ylabel(key)
        ax.grid(True, alpha=0.3)
        if log_y and min(ys) > 0:
            ax.set_yscale("log")
    axes[-1].set_xlabel("step")
    figure.suptitle(title or run_dir.name)
    out = Path(out_png) if out_png is not None else run_dir / "metrics.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png")
    return out
