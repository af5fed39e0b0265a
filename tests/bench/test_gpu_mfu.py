"""bench/gpu_mfu.py compares like with like: both variants reshard the root after forward (read back from FSDP2),
the FLOP count leaves out the embedding (a lookup), and an H100 PCIe / NVL is not given the SXM part's peak."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import gpu_mfu  # noqa: E402  (a script folder, not a package)

sys.path.remove(str(BENCH))


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("Tesla V100-SXM2-32GB", None),
    ],
)
def test_peak_is_the_most_specific_part(name: str, tflops: float | None) -> None:
    assert gpu_mfu.peak_tflops_of(name) == tflops


def test_flops_leave_out_the_embedding() -> None:
    config = {"vocab": 512, "dim": 128, "layers": 2, "heads": 4, "ffn": 344, "seq": 64}
    model = gpu_mfu.Llama(**config)  # on the CPU: a torch.device("meta") context imports torch._dynamo (seconds)
    total = sum(p.numel() for p in model.parameters())
    expected = 6 * (total - 512 * 128) + 12 * 2 * 128 * 64
    assert gpu_mfu.flops_per_token(model, 64) == expected


@pytest.mark.slow
def test_both_variants_run_with_the_same_fsdp_settings(bench_run) -> None:
    # Started with test_compare.py's run (conftest.py): gpu_mfu.py --tiny --no-compile --rounds 1 --steps 1 on the CPU.
    done = bench_run.done
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    by_variant = {line["variant"]: line for line in lines}
    keys = ("root_reshard_after_forward", "blocks_reshard_after_forward", "flops_per_token")
    assert [by_variant["accel"][k] for k in keys] == [by_variant["raw"][k] for k in keys], lines
    assert by_variant["raw"]["root_reshard_after_forward"] is True  # accel's FULL_SHARD, not fully_shard's default
