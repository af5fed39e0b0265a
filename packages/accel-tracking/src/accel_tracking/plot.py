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
    require("matplotlib", "plot", needed_by="Plotting metrics")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

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
        if all(float(x).is_integer() for x in xs):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at step 0.5
        if log_y and min(ys) > 0:
            ax.set_yscale("log")
    axes[-1].set_xlabel("step")
    figure.suptitle(title or run_dir.name)
    out = Path(out_png) if out_png is not None else run_dir / "metrics.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png")
    return out


def find_run(path: str | os.PathLike[str]) -> Path:
    """The run folder ``path`` names: itself (or its ``metrics.jsonl``'s folder), or the one run folder under it.

    A logging folder holding several runs is refused with their names, so that the user picks one.
    """
    path = Path(path)
    if path.is_file():
        return path.parent
    if not path.is_dir():
        raise ValueError(f"{path} does not exist: pass a run folder the local tracker wrote (it holds {METRICS_FILE}).")
    if (path / METRICS_FILE).is_file():
        return path
    runs = sorted(found.parent for found in path.glob(f"*/{METRICS_FILE}"))
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise ValueError(
            f"{path} holds no {METRICS_FILE}: pass the run folder of a run logged with the local tracker "
            "(<logging_dir>/<project name>, e.g. runs/digits)."
        )
    raise ValueError(f"{path} holds {len(runs)} runs: pass one of {', '.join(str(run) for run in runs)}.")


def main(argv: Sequence[str] | None = None, prog: str = "python -m accel_tracking.plot") -> int:
    """The command line of ``plot_metrics`` (``accel plot`` and ``python -m accel_tracking.plot``); returns 0.

    Raises ``ValueError`` / ``ImportError`` with the fix for a bad run folder or a missing matplotlib.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Draws the metrics of a run the local tracker wrote (its metrics.jsonl: the loss curve and "
        "every other number logged with accelerator.log) as a PNG, one panel per metric. Needs matplotlib: "
        'pip install "accel-tracking[plot]".',
        epilog=f"example: {prog} runs/digits --keys train_loss -o loss.png",
    )
    parser.add_argument(
        "run", metavar="RUN", help=f"the run folder (<logging_dir>/<project name>) or its {METRICS_FILE}"
    )
    parser.add_argument("--keys", nargs="+", metavar="KEY", help="the metrics to draw (default: every numeric one)")
    parser.add_argument("-o", "--output", metavar="PNG", help="the PNG to write (default: RUN/metrics.png)")
    parser.add_argument("--log-y", "--log_y", dest="log_y", action="store_true", help="a logarithmic y axis")
    parser.add_argument("--title", help="the figure's title (default: the run folder's name)")
    args = parser.parse_args(argv)
    run = find_run(args.run)
    written = plot_metrics(run, args.keys, args.output, title=args.title, log_y=args.log_y)
    records = read_metrics(run)
    print(f"wrote {written} ({len(records)} records of {run / METRICS_FILE})")
    return 0


if __name__ == "__main__":
    import sys

    try:
        sys.exit(main())
    except (ValueError, ImportError) as error:
        sys.exit(f"{sys.argv[0]}: error: {error}")
