"""Real Megatron-core tensor + data parallelism on CPU: one 2-process gloo launch runs every check in tp_checks.py."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_tensor_and_data_parallel_follow_plain_torch(torchrun, tmp_path) -> None:
    """TP=2 vs the unsplit model (AdamW, clipping), RNG streams, full-weight export, checkpoint replay,
    DP=2 vs torch DDP, and the refused settings (distributed optimizer, tp_degree=3, another TP degree on load)."""
    result = torchrun(HERE / "tp_checks.py", str(tmp_path), timeout=240)
    for rank in (0, 1):
        assert f"MEGATRON CHECKS PASSED {rank}" in result.stdout, result.stdout + result.stderr[-4000:]


@pytest.mark.slow
def test_megatron_dummy_scheduler_follows_megatrons_schedule(torchrun) -> None:
    """Accelerate's MegatronLMDummyScheduler in prepare: Megatron's warm-up + cosine lrs, stepped per DP process."""
    result = torchrun(HERE / "dummy_scheduler_checks.py", timeout=240)
    for rank in (0, 1):
        assert f"MEGATRON SCHEDULER CHECKS PASSED {rank}" in result.stdout, result.stdout + result.stderr[-4000:]


@pytest.mark.slow
def test_pipeline_stages_follow_one_process(torchrun, tmp_path) -> None:
    """PP=2 (1F1B) and PP=2 x 2 virtual stages (interleaved) through Megatron-core's schedules, 20 steps within
    1e-5 of one process, checkpoint replay; the CPU refusal naming megatron-core's CUDA calls (pp_checks.py)."""
    result = torchrun(HERE / "pp_checks.py", str(tmp_path), timeout=300)
    for rank in (0, 1):
        assert f"MEGATRON PP CHECKS PASSED {rank}" in result.stdout, result.stdout + result.stderr[-4000:]


@pytest.mark.slow
def test_tensor_by_pipeline_parallel_follows_one_process(torchrun, tmp_path) -> None:
    """TP=2 x PP=2 on 4 processes: 20 steps within 1e-5 of one process, gathered weights too (pp_checks.py)."""
    result = torchrun(HERE / "pp_checks.py", str(tmp_path), nproc=4, timeout=300)
    for rank in range(4):
        assert f"MEGATRON PP CHECKS PASSED {rank}" in result.stdout, result.stdout + result.stderr[-4000:]
