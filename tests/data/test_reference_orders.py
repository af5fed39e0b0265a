"""accel's prepared loaders give each process the same samples, in the same order, as Accelerate 1.15.

``reference/loader_orders.py`` is an Accelerate user's script (only the import differs); it was run
once with Accelerate 1.15.0 on 2 real processes (``reference/record_reference.sh``) and its output
committed as ``reference/accelerate_1_15_orders.json``. Here the same script runs with accel under
torchrun and every case (shuffle on/off, seeds, split_batches, even_batches, drop_last, the
seedable sampler, a user generator, a SubsetRandomSampler fold, a sampler yielding index batches,
skip_first_batches, non-divisible lengths, a user's batch sampler class, loops left early as early
stopping leaves them) must give the same per-process orders for 3 epochs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "reference"
FIXTURE = HERE / "accelerate_1_15_orders.json"

# Cases where accel differs on purpose: case -> (what still matches, why).
#   "epochs 0-1": the first two epochs; "all but the last step": every epoch but for its last step;
#   "none": the cases hold the same samples per epoch, in another order.
DISPATCH_PADS = (
    "With dispatch_batches=True Accelerate ignores even_batches (the last step is split unevenly, "
    "without padding); accel's dispatcher honours it as sharded loaders do (padding from the start, "
    "`remainder` for gather_for_metrics)."
)
KNOWN_DIFFERENCES = {
    "skip_first_batches_seedable": (
        "epochs 0-1",
        "Accelerate's loader from skip_first_batches keeps its own epoch counter, so without set_epoch the next "
        "epoch of the original loader repeats the skipped epoch's seedable order; accel's shares the counter "
        "(the next epoch is a new order). With loader.set_epoch(epoch) both agree "
        "(skip_first_batches_seedable_set_epoch).",
    ),
    "dispatch_no_shuffle": ("all but the last step", DISPATCH_PADS),
    "dispatch_seedable": ("all but the last step", DISPATCH_PADS),
    "dispatch": ("all but the last step", DISPATCH_PADS),
    "dispatch_split": ("all but the last step", DISPATCH_PADS),
}


def _still_matching(name: str, got: list, want: list) -> bool:
    kind = KNOWN_DIFFERENCES[name][0]
    if kind == "epochs 0-1":
        return all(got[r][e] == want[r][e] for r in range(2) for e in (0, 1))
    if kind == "all but the last step":
        return all(got[r][e][:-1] == want[r][e][:-1] for r in range(2) for e in range(3))

    def samples(orders: list, epoch: int) -> set[int]:
        return {i for rank in orders for batch in rank[epoch] for i in batch}

    return all(samples(got, e) == samples(want, e) for e in range(3))


@pytest.mark.slow
def test_orders_match_accelerate_1_15(torchrun, tmp_path) -> None:
    out = tmp_path / "accel_orders.json"
    torchrun(HERE / "loader_orders.py", "--lib", "accel", "--out", str(out), timeout=400)
    reference = json.loads(FIXTURE.read_text())
    ours = json.loads(out.read_text())
    assert reference["library"].startswith("accelerate 1.15") and reference["processes"] == ours["processes"] == 2
    assert ours["cases"].keys() == reference["cases"].keys()
    mismatches = []
    for name, expected in reference["cases"].items():
        got = ours["cases"][name]["orders"]
        want = expected["orders"]
        if name in KNOWN_DIFFERENCES:
            assert _still_matching(name, got, want), f"{name}: more than the documented difference"
            assert got != want, f"{name} now matches Accelerate: remove it from KNOWN_DIFFERENCES and the README"
            continue
        for rank in range(2):
            if got[rank] != want[rank]:
                mismatches.append(f"{name} rank {rank}:\n  accel      {got[rank]}\n  accelerate {want[rank]}")
    assert not mismatches, "\n".join(mismatches)
