"""Summaries of a comparison run: compare.json (every sample), compare.md (the table) and one PNG chart per scenario."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

# (scenario, processes, metric, row label, unit): the rows of the table, in order; lower is better for every timing.
ROWS: list[tuple[str, str, str, str, str]] = [
    ("import", "1", "over_torch_s", "import time over `import torch`", "s"),
    ("cli_help", "1", "help_s", "CLI `--help` (raw: `torchrun --help`)", "s"),
    ("launch", "1", "first_step_s", "launch to first step, 1 process", "s"),
    ("launch", "2", "first_step_s", "launch to first step, 2 processes", "s"),
    ("step", "1", "step_ms", "train step (accum. 2, clip, scheduler), 1 process", "ms"),
    ("step", "2", "step_ms", "train step (accum. 2, clip, scheduler), 2 processes", "ms"),
    ("step", "2", "overhead_us", "limit: train step minus raw DDP's, 2 processes (0 is the floor)", "µs"),
    ("step", "1", "peak_rss_mb", "peak resident memory per process, train step, 1 process", "MB"),
    ("step", "2", "peak_rss_mb", "peak resident memory per process (the larger), train step, 2 processes", "MB"),
    ("loader", "1", "sharded_ms", "prepared loader per batch, 1 process", "ms"),
    ("loader", "2", "sharded_ms", "prepared loader per batch, sharded, 2 processes", "ms"),
    ("loader", "2", "dispatch_ms", "prepared loader per batch, dispatched, 2 processes", "ms"),
    ("gather", "2", "gather_ms", "gather_for_metrics per eval batch, 2 processes (Fabric: all_gather)", "ms"),
    ("gather", "2", "exact_count", "gathered eval set has exactly its samples (no padding)", "yes/no"),
    ("checkpoint", "1", "save_s", "save_state (Fabric: save; raw: torch.save)", "s"),
    ("checkpoint", "1", "save_nofsync_s", "save_state without fsync (like for like with the others)", "s"),
    ("checkpoint", "1", "load_s", "load_state (Fabric: load; raw: torch.load)", "s"),
    ("checkpoint", "1", "async_blocked_s", "async save: time the caller is blocked", "s"),
    ("checkpoint", "1", "async_over_save", "async save: time blocked / the durable save_state (goal <= 0.25)", "x"),
    (
        "checkpoint",
        "1",
        "disk_write_s",
        "limit: the disk's own durable write of as many bytes (best of 1 file, 4 at once)",
        "s",
    ),
    (
        "checkpoint",
        "1",
        "save_over_disk_write",
        "limit: durable save_state / the disk's durable write, back to back (1 is the floor)",
        "x",
    ),
    ("checkpoint", "1", "disk_read_s", "limit: the disk's own read of as many bytes (not cached)", "s"),
    ("resume", "2", "exact", "exact resume mid-epoch (bitwise weights), 2 processes", "yes/no"),
    ("crash", "1", "safe", "SIGKILL during an overwriting save, then resume", "yes/no"),
    ("fsdp2", "2", "memory_fraction", "FSDP2: bytes held per process / unsharded (params+grads+AdamW)", "x"),
    ("fsdp2", "2", "step_ms", "FSDP2: train step, 2 processes", "ms"),
    ("zero3", "2", "memory_fraction", "ZeRO-3: bytes held per process / unsharded", "x"),
    ("zero3", "2", "step_ms", "ZeRO-3: train step, 2 processes", "ms"),
]


# Why accel trails where it does, for the rows where the reason is known (measured elsewhere or by design); shown
# only when the data puts accel behind. Which rows and by how much always comes from the data itself.
REASONS: dict[tuple[str, str], str] = {
    ("checkpoint", "save_s"): "accel fsyncs every file (durable against a power cut), the others do not: "
    "see the no-fsync row",
    ("gather", "gather_ms"): "accel checks every rank's shapes and dtypes before gathering "
    "(one all_gather with the payload; bench/collective_check.py)",
}
# Rows whose target is the hand-written counterpart (raw: fully_shard by hand, DeepSpeed's own API) rather than a peer
# (the peers do not shard on CPU): the last column also gives accel's median over raw's.
HAND_WRITTEN = {("fsdp2", "step_ms"), ("zero3", "step_ms")}
# accel's like-for-like figure is its own row; the peers' is another (accel's save without fsync vs their save).
PEER_METRIC = {("checkpoint", "save_nofsync_s"): "save_s"}
NOTE_CHARS = 110  # a note longer than this is cut in the tables (the JSON keeps it whole)
NAMES = {"accel": "accel", "raw": "raw PyTorch", "accelerate": "HF Accelerate", "fabric": "Lightning Fabric"}
SHORT = {"accel": "accel", "raw": "raw", "accelerate": "Accelerate", "fabric": "Fabric"}


def stats(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "q1": q[0],
        "q3": q[2],
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
        "values": values,
    }


def step_overhead(samples: dict, procs: str, fw: str) -> dict[str, Any] | None:
    """`fw`'s train step minus raw PyTorch's (µs) on `procs` processes, from the same run's samples: the median of
    per-launch differences when both have a sample of every repetition (launch i of each ran in the same
    rotation round, so a change of load between rounds cancels), else the difference of their medians."""
    by_fw = samples.get("step", {}).get(procs, {})
    mine, raw = by_fw.get(fw, {}).get("step_ms", []), by_fw.get("raw", {}).get("step_ms", [])
    if not mine or not raw:
        return None
    if len(mine) == len(raw):
        figure = stats([(a - b) * 1e3 for a, b in zip(mine, raw, strict=True)])
        return {**figure, "method": "median of per-launch differences"}
    figure = stats([(statistics.median(mine) - statistics.median(raw)) * 1e3])
    return {**figure, "method": f"difference of medians ({len(mine)} vs {len(raw)} launches)"}


def summarise(results) -> dict:
    out: dict = {}
    for scenario, by_procs in results.samples.items():
        for procs, by_fw in by_procs.items():
            for fw, metrics in by_fw.items():
                for metric, values in metrics.items():
                    slot = out.setdefault(scenario, {}).setdefault(procs, {}).setdefault(fw, {})
                    if all(isinstance(v, bool) for v in values):
                        slot[metric] = {"value": all(values), "n": len(values)}
                    elif all(isinstance(v, (int, float)) for v in values):
                        slot[metric] = stats([float(v) for v in values])
                    else:
                        slot[metric] = {"value": values[0] if len(values) == 1 else values}
    for procs, by_fw in results.samples.get("step", {}).items():  # derived: the per-step overhead over raw
        for fw in by_fw:
            overhead = step_overhead(results.samples, procs, fw) if fw != "raw" else None
            if overhead is not None:
                out["step"][procs][fw]["overhead_us"] = overhead
    return out


def _fmt(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.2f}" if value < 10 else f"{value:.1f}"
    if unit == "x":
        return f"{value:.2f}"
    if unit in ("MB", "µs"):
        return f"{value:.0f}"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"


def cell(summary: dict, notes: dict, scenario: str, procs: str, fw: str, metric: str, unit: str) -> str:
    note = notes.get(scenario, {}).get(procs, {}).get(fw)
    if note and len(note) > NOTE_CHARS:
        note = note[: NOTE_CHARS - 1] + "…"
    figure = summary.get(scenario, {}).get(procs, {}).get(fw, {}).get(metric)
    if figure is None:
        return f"— ({note})" if note else "—"
    if "median" not in figure:
        value = figure["value"]
        text = ("yes" if value else "**no**") if isinstance(value, bool) else str(value)
    else:
        text = _fmt(figure["median"], unit)
        if figure["n"] > 1:
            text += f" ({_fmt(figure['q1'], unit)} to {_fmt(figure['q3'], unit)})"
    return f"{text}; {note}" if note else text


def not_ahead(summary: dict, notes: dict, row: tuple[str, str, str, str, str], frameworks: list[str]) -> str:
    """Where accel is not ahead of its peers (Accelerate, Fabric) on this row, from the data: who does better and by
    how much (ratio of medians to accel's, when the interquartile ranges do not overlap), with the reason where
    known; a peer whose median is lower but whose interquartile range overlaps accel's is "level" (the samples do
    not tell them apart), with the number of samples. Raw PyTorch is the floor every framework adds to, not a peer;
    figures of a peer noted as not doing the work (e.g. not sharding) are left out of the comparison."""
    scenario, procs, metric, _label, _unit = row
    verdict = _versus_peers(summary, notes, row, frameworks)
    raw = summary.get(scenario, {}).get(procs, {}).get("raw", {}).get(metric)
    mine = summary.get(scenario, {}).get(procs, {}).get("accel", {}).get(metric)
    if (scenario, metric) in HAND_WRITTEN and raw and mine and "median" in raw and "median" in mine:
        verdict += f"; {mine['median'] / raw['median']:.2f}x the hand-written ({SHORT['raw']})"
    return verdict


def _versus_peers(summary: dict, notes: dict, row: tuple[str, str, str, str, str], frameworks: list[str]) -> str:
    scenario, procs, metric, _label, unit = row

    def figure(fw: str) -> dict | None:
        note = notes.get(scenario, {}).get(procs, {}).get(fw, "")
        if "did not shard" in note:
            return None
        wanted = metric if fw == "accel" else PEER_METRIC.get((scenario, metric), metric)
        return summary.get(scenario, {}).get(procs, {}).get(fw, {}).get(wanted)

    mine = figure("accel")
    if mine is None:
        return "no accel figure" if "accel" in frameworks else ""
    better, compared = [], 0
    level: list[tuple[str, int]] = []
    for fw in frameworks:
        theirs = figure(fw)
        if fw in ("accel", "raw") or theirs is None:
            continue
        compared += 1
        if unit == "yes/no":
            if theirs.get("value") is True and mine.get("value") is not True:
                better.append(SHORT[fw])
        elif "median" in theirs and "median" in mine and theirs["median"] < mine["median"]:
            samples = min(theirs.get("n", 1), mine.get("n", 1))
            if samples > 1 and theirs["q3"] >= mine["q1"]:  # the interquartile ranges overlap: not told apart
                level.append((SHORT[fw], samples))
                continue
            if unit == "µs":  # a difference (it may be negative): a ratio would mean nothing
                gap = f"{mine['median'] - theirs['median']:.0f} µs less"
            else:
                gap = f"{theirs['median'] / mine['median'] if mine['median'] > 0 else float('nan'):.2f}x"
            better.append(f"{SHORT[fw]} {gap}" + (" (beyond the spread)" if samples > 1 else " (1 sample)"))
    if not compared:
        return "no peer figure"
    level_text = (
        "level with " + ", ".join(name for name, _ in level) + f" (spreads overlap, {min(n for _, n in level)} samples)"
        if level
        else ""
    )
    if not better:
        if unit == "yes/no":
            return "ahead" if mine.get("value") is True else "no one does"
        return level_text.replace("level with", "level:", 1) if level else "ahead"
    reason = REASONS.get((scenario, metric))
    return "behind: " + ", ".join(better) + (f"; {level_text}" if level else "") + (f" — {reason}" if reason else "")


def table(summary: dict, notes: dict, frameworks: list[str], rows: list | None = None, verdict: bool = True) -> str:
    lines = [
        "| scenario | unit | "
        + " | ".join(NAMES[f] for f in frameworks)
        + (" | where accel is not ahead |" if verdict else " |"),
        "|---|---|" + "---|" * (len(frameworks) + verdict),
    ]
    for row in rows or ROWS:
        scenario, procs, metric, label, unit = row
        cells = [cell(summary, notes, scenario, procs, fw, metric, unit) for fw in frameworks]
        if all(c == "—" for c in cells):
            continue
        if verdict:
            cells.append(not_ahead(summary, notes, row, frameworks))
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def charts(summary: dict, frameworks: list[str], folder: Path) -> list[str]:
    """One bar chart per scenario: median per framework, the bars' whiskers spanning the interquartile range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"accel": "#1f77b4", "raw": "#7f7f7f", "accelerate": "#ff7f0e", "fabric": "#9467bd"}
    written = []
    scenarios: dict[str, list[tuple[str, str, str, str]]] = {}
    for scenario, procs, metric, label, unit in ROWS:
        if unit not in ("yes/no",):
            scenarios.setdefault(scenario, []).append((procs, metric, label, unit))
    for scenario, rows in scenarios.items():
        rows = [
            r for r in rows if any(summary.get(scenario, {}).get(r[0], {}).get(fw, {}).get(r[1]) for fw in frameworks)
        ]
        if not rows:
            continue
        fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.6), squeeze=False)
        for ax, (procs, metric, label, unit) in zip(axes[0], rows, strict=True):
            for i, fw in enumerate(frameworks):
                figure = summary.get(scenario, {}).get(procs, {}).get(fw, {}).get(metric)
                if not figure or "median" not in figure:
                    ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=8)
                    continue
                m = figure["median"]
                ax.bar(i, m, color=colours[fw], yerr=[[m - figure["q1"]], [figure["q3"] - m]], capsize=4)
            ax.set_xticks(range(len(frameworks)), frameworks, fontsize=8)
            ax.set_title(label if len(label) < 48 else label[:46] + "…", fontsize=8)
            ax.set_ylabel(unit)
        fig.tight_layout()
        path = folder / f"{scenario}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path.name)
    return written


# The rows the root README shows (the full table is in bench/results/README.md).
SUMMARY_ROWS = [
    ("cli_help", "1", "help_s"),
    ("launch", "2", "first_step_s"),
    ("step", "2", "step_ms"),
    ("step", "2", "overhead_us"),
    ("step", "2", "peak_rss_mb"),
    ("loader", "2", "sharded_ms"),
    ("gather", "2", "gather_ms"),
    ("gather", "2", "exact_count"),
    ("checkpoint", "1", "save_s"),
    ("checkpoint", "1", "save_nofsync_s"),
    ("checkpoint", "1", "save_over_disk_write"),
    ("checkpoint", "1", "load_s"),
    ("resume", "2", "exact"),
    ("crash", "1", "safe"),
    ("fsdp2", "2", "memory_fraction"),
]


def replace_block(path: Path, name: str, text: str) -> bool:
    """Replaces what lies between `<!-- compare:NAME:start -->` and `<!-- compare:NAME:end -->` in `path`; False
    (and the file untouched) where the markers are missing."""
    if not path.exists():
        return False
    content = path.read_text()
    start, end = f"<!-- compare:{name}:start -->", f"<!-- compare:{name}:end -->"
    if start not in content or end not in content:
        return False
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{text.strip()}\n{end}{tail}")
    return True


def write(results, meta: dict, frameworks: list[str], folder: Path, readmes: dict[str, Path] | None = None) -> str:
    """Writes compare(-quick).json and .md and, for a full run, the charts and the tables inside `readmes`
    ({"results": bench/results/README.md, "summary": the root README}: the blocks between their markers)."""
    folder.mkdir(parents=True, exist_ok=True)
    summary = summarise(results)
    data = {
        "meta": meta,
        "frameworks": frameworks,
        "summary": summary,
        "samples": results.samples,
        "notes": results.notes,
        "errors": results.errors,
    }
    stem = "compare-quick" if meta["quick"] else "compare"
    (folder / f"{stem}.json").write_text(json.dumps(data, indent=1, default=str))
    text = table(summary, results.notes, frameworks)
    pngs = [] if meta["quick"] else charts(summary, frameworks, folder)
    versions = "; ".join(
        f"{fw}: " + ", ".join(f"{k} {v}" for k, v in vs.items()) for fw, vs in meta["versions"].items()
    )
    runs = meta.get("runs", [meta])
    done = "; ".join(
        f"{'+'.join(r.get('phases', []))} from {r['date']} ({r['reps']} start-up repetitions, "
        f"{r.get('in_process_reps', r['reps'])} in-process launches, {r['seconds']} s)"
        for r in runs
    )
    header = (
        f"{meta['cpus']} CPU cores (gloo), frameworks alternating; median (interquartile range where there "
        f"is more than one sample; each in-process launch is itself the median of several rounds). Runs: {done}. "
        f"Load average at the end of a run: {meta['load_at_end']:.1f}. Versions: {versions}. "
        "Last column: the peers that did better than accel, as their median / accel's (raw PyTorch, the floor, is "
        "not counted as a peer)."
    )
    body = header + "\n\n" + text + "\n"
    if pngs:
        body += "\nCharts: " + ", ".join(f"[{p[:-4]}]({p})" for p in pngs) + "\n"
    (folder / f"{stem}.md").write_text(body)
    if not meta["quick"] and readmes:
        if "results" in readmes:
            replace_block(readmes["results"], "results", body)
        if "summary" in readmes:
            wanted = {(s, p, m) for s, p, m in SUMMARY_ROWS}
            rows = [r for r in ROWS if r[:3] in wanted]
            compact = table(summary, results.notes, frameworks, rows=rows)
            when = ", ".join(dict.fromkeys(r["date"] for r in runs))
            replace_block(
                readmes["summary"],
                "summary",
                f"Measured {when} on {meta['cpus']} CPU cores (load average {meta['load_at_end']:.1f} at the end); "
                f"median, interquartile range in brackets; last column: the peers that did better, their median / "
                f"accel's.\n\n" + compact,
            )
    return body
