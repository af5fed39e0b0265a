"""bench/compare: the accel-only scenarios of the side-by-side benchmark run and produce a table (the CI smoke of
`bench/compare/run.py --quick` needs the peers' environments; this checks accel's side without them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

COMPARE = Path(__file__).resolve().parents[2] / "bench" / "compare"


@pytest.mark.slow
def test_accel_scenarios_run_in_one_process(bench_run) -> None:
    # Started with test_gpu_mfu.py's run (conftest.py): bench/compare/worker.py --framework accel --quick
    # --scenarios step,loader,gather,checkpoint, writing out.json in bench_run.folder.
    done, out = bench_run.done, bench_run.folder / "out.json"
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["step"]["step_ms"] > 0
    assert 50 < figures["step"]["peak_rss_mb"] < 5000  # torch and accel imported, a model trained: tens to hundreds
    assert figures["loader"]["sharded_ms"] > 0
    assert figures["gather"] == {**figures["gather"], "exact_count": True, "rows": 401, "samples": 401}
    assert figures["checkpoint"]["async_blocked_s"] > 0 and figures["checkpoint"]["mb"] > 30
    checkpoint = figures["checkpoint"]
    assert checkpoint["disk_write_s"] > 0 and checkpoint["disk_read_s"] > 0  # the limit rows
    # One round in --quick: the limit is the faster of its two ways.
    assert checkpoint["disk_write_s"] == min(checkpoint["disk_write_one_s"], checkpoint["disk_write_many_s"])
    # The durable save over the limit measured next to it, in the same round.
    assert checkpoint["save_over_disk_write"] == checkpoint["save_s"] / checkpoint["disk_write_s"]
    # The async save: the first (it allocates the snapshot's buffers) apart from the rounds, which reuse them.
    assert checkpoint["async_first_blocked_s"] > 0
    assert checkpoint["async_over_save"] == checkpoint["async_blocked_s"] / checkpoint["save_s"]  # one round


def test_table_marks_failures_and_yes_no() -> None:
    sys.path.insert(0, str(COMPARE))
    try:
        import report
        from run import Results
    finally:
        sys.path.remove(str(COMPARE))
    results = Results()
    for value in (1.0, 2.0, 3.0):
        results.take("step", 1, "accel", {"step_ms": value})
    results.take("resume", 2, "fabric", {"exact": False, "max_abs_diff": 0.1})
    results.take("fsdp2", 2, "fabric", {"error": "RuntimeError: FSDP needs CUDA"})
    results.take("step", 1, "raw", {"error": "boom"})
    summary = report.summarise(results)
    assert summary["step"]["1"]["accel"]["step_ms"]["median"] == 2.0
    text = report.table(summary, results.notes, ["accel", "raw", "fabric"])
    assert "| 2.00 (1.50 to 2.50) | — (error) |" in text
    assert "**no**" in text and "refused: RuntimeError: FSDP needs CUDA" in text
    assert results.errors == ["step / raw / 1 proc: boom"]  # a peer's refusal of FSDP is a note, not an error


def test_last_column_and_readme_blocks_come_from_the_data(tmp_path: Path) -> None:
    sys.path.insert(0, str(COMPARE))
    try:
        import report
        from run import Results
    finally:
        sys.path.remove(str(COMPARE))
    results = Results()
    for accel, fabric in ((3.0, 1.0), (3.1, 1.1), (3.2, 1.2)):
        results.take("step", 2, "accel", {"step_ms": accel})
        results.take("step", 2, "fabric", {"step_ms": fabric})
        results.take("checkpoint", 1, "accel", {"save_s": 2.0})
        results.take("checkpoint", 1, "raw", {"save_s": 0.5})  # the floor, not a peer: not in the last column
        results.take("checkpoint", 1, "accelerate", {"save_s": 1.0})
    results.take("resume", 2, "accel", {"exact": True})
    results.take("resume", 2, "fabric", {"exact": False})
    for accel, fabric in ((1.0, 0.9), (1.5, 1.4), (2.0, 1.9)):  # lower medians, overlapping spreads: level
        results.take("gather", 2, "accel", {"gather_ms": accel})
        results.take("gather", 2, "fabric", {"gather_ms": fabric})
    results.take("fsdp2", 2, "accel", {"memory_fraction": 0.5})
    results.take("fsdp2", 2, "accelerate", {"memory_fraction": 0.4})  # noted below as not sharding: not compared
    results.note("fsdp2", 2, "accelerate", "ran, but did not shard (data parallel: every process holds all)")
    summary = report.summarise(results)
    rows = {row[:3]: row for row in report.ROWS}

    def verdict(*key: str) -> str:
        return report.not_ahead(summary, results.notes, rows[key], ["accel", "raw", "accelerate", "fabric"])

    assert verdict("step", "2", "step_ms") == "behind: Fabric 0.35x (beyond the spread)"
    assert verdict("checkpoint", "1", "save_s").startswith(
        "behind: Accelerate 0.50x (beyond the spread) — accel fsyncs"
    )
    assert verdict("gather", "2", "gather_ms") == "level: Fabric (spreads overlap, 3 samples)"
    assert verdict("resume", "2", "exact") == "ahead"
    assert verdict("fsdp2", "2", "memory_fraction") == "no peer figure"  # Accelerate's did not shard
    results.take("fsdp2", 2, "accel", {"step_ms": 98.0})
    results.take("fsdp2", 2, "raw", {"step_ms": 100.0})  # fully_shard by hand: the target of this row
    summary = report.summarise(results)
    assert verdict("fsdp2", "2", "step_ms") == "no peer figure; 0.98x the hand-written (raw)"

    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- compare:results:start -->\nold table\n<!-- compare:results:end -->\noutro\n")
    assert report.replace_block(readme, "results", "| new |")
    assert readme.read_text() == "intro\n<!-- compare:results:start -->\n| new |\n<!-- compare:results:end -->\noutro\n"
    untouched = tmp_path / "other.md"
    untouched.write_text("no markers\n")
    assert not report.replace_block(untouched, "results", "| new |") and untouched.read_text() == "no markers\n"


def test_overhead_and_memory_rows_come_from_the_same_run() -> None:
    sys.path.insert(0, str(COMPARE))
    try:
        import report
        from run import Results
    finally:
        sys.path.remove(str(COMPARE))
    results = Results()
    # Launch i of each framework ran in the same round: the rounds' load moves both; the per-launch differences
    # (0.1, 0.2, 0.3 ms) are steadier than either series.
    for accel, raw, fabric in ((5.1, 5.0, 5.2), (8.2, 8.0, 8.0), (6.3, 6.0, 6.1)):
        results.take("step", 2, "accel", {"step_ms": accel, "peak_rss_mb": 400.0})
        results.take("step", 2, "raw", {"step_ms": raw, "peak_rss_mb": 380.0})
        results.take("step", 2, "fabric", {"step_ms": fabric, "peak_rss_mb": 700.0})
    results.take("step", 1, "accel", {"step_ms": 2.0})
    results.take("step", 1, "accel", {"step_ms": 3.0})
    results.take("step", 1, "raw", {"step_ms": 2.5})  # one raw launch failed: no pairs, the medians' difference
    summary = report.summarise(results)
    overhead = summary["step"]["2"]["accel"]["overhead_us"]
    assert overhead["method"] == "median of per-launch differences" and round(overhead["median"]) == 200
    assert "overhead_us" not in summary["step"]["2"]["raw"]  # raw is the floor
    assert round(summary["step"]["2"]["fabric"]["overhead_us"]["median"]) == 100
    assert summary["step"]["1"]["accel"]["overhead_us"]["method"].startswith("difference of medians (2 vs 1")
    frameworks = ["accel", "raw", "fabric"]
    rows = {row[:3]: row for row in report.ROWS}
    text = report.table(summary, results.notes, frameworks)
    assert "| limit: train step minus raw DDP's, 2 processes (0 is the floor) | µs | 200 (150 to 250) | — |" in text
    assert "| MB | 400 (400 to 400) | 380 (380 to 380) | 700 (700 to 700) | ahead |" in text
    verdict = report.not_ahead(summary, results.notes, rows[("step", "2", "overhead_us")], frameworks)
    # Fabric's overhead (0, 100, 200 µs) is lower, but its interquartile range reaches accel's (150 to 250): level
    assert verdict == "level: Fabric (spreads overlap, 3 samples)"
    results.take("step", 2, "fabric", {"step_ms": 4.0})  # now clearly less: a difference, not a ratio of overheads
    results.take("step", 2, "accel", {"step_ms": 7.0})
    results.take("step", 2, "raw", {"step_ms": 6.0})
    summary = report.summarise(results)
    verdict = report.not_ahead(summary, results.notes, rows[("step", "2", "overhead_us")], frameworks)
    assert verdict.startswith("behind: Fabric ") and verdict.endswith(" µs less (beyond the spread)")
