"""Each script of tests/compat/examples/ (Accelerate's example scripts, same library calls, synthetic data) runs
to the end under `accel launch --cpu -n 2` and ends with the final metrics that the same file printed on
Accelerate 1.15 with 2 CPU processes, as recorded in reference_comparison.json by run_reference_comparison.py.

Runs still waiting for an accel feature are listed in PENDING, by feature, and expected to fail (strict:
the moment one passes, the test fails until it is taken off the list). CI runs the CI_RUNS subset;
ACCEL_COMPAT_EXAMPLES=all runs every example (about twice as long).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("run_reference_comparison", HERE / "run_reference_comparison.py")
harness = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = harness  # dataclasses look their module up there
_spec.loader.exec_module(harness)

_RESULTS = json.loads(harness.RESULTS_JSON.read_text())
RECORDED = {row["id"]: row for row in _RESULTS["rows"]}
# Where the reference's numbers were recorded (None: before the recording said so).
RECORDED_PROCESSOR: str | None = _RESULTS.get("processor")

# Runs that fail today, by the accel feature they wait for (see reference_comparison.md for the measured
# difference). A new entry needs a reason. A backend run whose
# numbers differ from the reference's plain run for a reason out of accel's hands says so in its Example's
# `known_gap` (run_reference_comparison.py): it must still run to the end with the backend engaged, and is
# reported as an expected failure with that reason while the difference lasts.
PENDING: dict[str, set[str]] = {
    # transformers' masked-LM script: its collator masks with torch's global RNG, and accel's loader (no workers)
    # collates each batch after the previous step where Accelerate's collates one batch ahead; accel keeps its order
    # because it resumes exactly (docs/coming_from_accelerate.md). Accel read ahead as Accelerate reads gives the
    # reference's numbers exactly; both at once need the batch read ahead (or the RNG states before it) in the
    # checkpoint.
    "Accelerate's read-ahead order with an exact resume (accel-data, num_workers=0)": {
        "mlm_no_trainer[steps]",
        "mlm_no_trainer[resume_step_10]",
    },
}

# The examples CI runs (one launch each, ~8-10 s on a quiet 2-core machine, 25-55 s on a loaded one): one per
# distinct behaviour (reference scheduler stepping, exact resume, find_executable_batch_size with the
# accumulation setter, comm hooks, early stopping's trigger and next-epoch order, accumulation, LocalSGD,
# schedule-free). The other 12 make the same calls in other combinations (fsdp_with_peak_mem_tracking under real
# FSDP2): ACCEL_COMPAT_EXAMPLES=all runs them.
CI_RUNS: set[str] = {
    "nlp_example",
    "checkpointing[steps]",
    "checkpointing[resume_step_12]",
    "automatic_gradient_accumulation",
    "ddp_comm_hook[power_sgd_fp16]",
    "early_stopping",
    "gradient_accumulation",
    "local_sgd",
    "schedule_free",
}


def _pending_feature(run_id: str) -> str | None:
    return next((feature for feature, runs in PENDING.items() if run_id in runs), None)


def _params() -> list[Any]:
    everything = os.environ.get("ACCEL_COMPAT_EXAMPLES") == "all"
    params = []
    for example in harness.EXAMPLES:
        for run_id in example.run_ids():
            if not everything and run_id not in CI_RUNS:
                continue
            feature = _pending_feature(run_id)
            marks = [pytest.mark.xfail(reason=f"waits for: {feature}", strict=True)] if feature else []
            params.append(pytest.param(example, run_id, id=run_id, marks=marks))
    return params


@functools.cache
def _accel_results(example_name: str) -> dict[str, dict[str, Any]]:
    """Every run of one example on accel, in order (a resume run reads the checkpoints of the run before)."""
    example = next(e for e in harness.EXAMPLES if e.name == example_name)
    workdir = Path(tempfile.mkdtemp(prefix=f"compat-{example_name}-"))
    try:
        return {
            run_id: harness.run_one("accel", example, run, workdir, None, timeout=600)
            for run_id, run in zip(example.run_ids(), example.runs, strict=True)
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_pending_names_real_runs():
    known = {run_id for example in harness.EXAMPLES for run_id in example.run_ids()}
    listed = set().union(*PENDING.values()) if PENDING else set()
    assert listed <= known, f"PENDING names runs that do not exist: {sorted(listed - known)}"
    assert known >= CI_RUNS, f"CI_RUNS names runs that do not exist: {sorted(CI_RUNS - known)}"


@pytest.mark.slow
@pytest.mark.parametrize(("example", "run_id"), _params())
def test_example_matches_reference(example, run_id):
    for module in example.needs:
        pytest.importorskip(module)
    # A resumed run must end as Accelerate's uninterrupted run did: exact resume. (Accelerate's own resumed
    # runs of these scripts do not: its shuffle generator is not in the checkpoint; see the table.)
    run = next(r for r in example.runs if example.run_id(r.label) == run_id)
    target_id = example.run_id(run.continues) if run.continues else run_id
    ignore = harness.RESUME_IGNORED if run.continues else example.ignored()
    recorded = RECORDED.get(target_id)
    assert recorded and recorded["reference"] and recorded["reference"]["ok"], (
        f"no reference metrics recorded for {target_id}: run tests/compat/run_reference_comparison.py"
    )
    result = _accel_results(example.name)[run_id]
    assert result["ok"], (
        f"{run_id} did not run to the end on accel: {result['error']}\n{result.get('stderr_tail') or ''}"
    )
    if example.accel_prints:
        assert result["engaged"], (
            f"{run_id} did not print {example.accel_prints!r}: the feature it shows was not engaged"
        )
    # Bit for bit on the processor the reference was recorded on; elsewhere its last-bit rounding is allowed.
    other_processor = harness.processor_kernels() != RECORDED_PROCESSOR
    differences = harness.differences(
        recorded["reference"]["metrics"],
        result["metrics"],
        ignore=ignore,
        tolerances=example.tolerances(),
        other_processor=other_processor,
    )
    if example.known_gap:
        assert differences, f"{run_id} now matches the reference: remove its Example's known_gap"
        pytest.xfail(f"out of accel's hands: {differences}: {example.known_gap}")
    tolerance = harness.TOLERANCE_TEXT + (f"; {harness.OTHER_PROCESSOR_TEXT}" if other_processor else "")
    assert not differences, f"{run_id} final metrics differ from Accelerate's {target_id} ({tolerance}): {differences}"


def test_another_processor_may_round_the_last_bits_and_nothing_more():
    # Measured between two CI machines with the same torch: a float32 loss 1 ULP apart, a float64 norm 2.5e-9 apart.
    measured = {"last_loss": 0.6565830111503601, "weight_norm": 24.450757597875207}
    elsewhere = {"last_loss": 0.6565830707550049, "weight_norm": 24.45075753757839}
    assert len(harness.differences(measured, elsewhere)) == 2  # bit for bit on the recording's processor
    assert harness.differences(measured, elsewhere, other_processor=True) == []
    # What a behaviour change moves stays visible: a left-out comm hook (~1e-7 on the weights), 3 float32 ULPs.
    shifted = {"last_loss": 0.6565830111503601 + 3 * 2**-24, "weight_norm": 24.450757597875207 * (1 + 1e-7)}
    assert len(harness.differences(measured, shifted, other_processor=True)) == 2
