"""Real Megatron-core tensor, data and pipeline parallelism on CPU (gloo): each check script launched once (pp_checks.py
once on 2 and once on 4 processes), each of its checks one test."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

HERE = Path(__file__).resolve().parent
TP_SCRIPT = HERE / "tp_checks.py"
DUMMY_SCHEDULER_SCRIPT = HERE / "dummy_scheduler_checks.py"
PP_SCRIPT = HERE / "pp_checks.py"


@pytest.fixture(scope="module")
def tp_run(torchrun_checks, tmp_path_factory):
    return torchrun_checks(TP_SCRIPT, str(tmp_path_factory.mktemp("tp")), timeout=240)


@pytest.mark.parametrize("name", checks_in(TP_SCRIPT))
def test_tensor_and_data_parallel_follow_plain_torch(tp_run, name) -> None:
    """TP=2 vs the unsplit model (AdamW, clipping), RNG streams, full-weight export, checkpoint replay,
    DP=2 vs torch DDP, and the refused settings (distributed optimizer, tp_degree=3, another TP degree on load)."""
    tp_run.assert_passed(name)


@pytest.fixture(scope="module")
def dummy_scheduler_run(torchrun_checks):
    return torchrun_checks(DUMMY_SCHEDULER_SCRIPT, timeout=240)


@pytest.mark.parametrize("name", checks_in(DUMMY_SCHEDULER_SCRIPT))
def test_megatron_dummy_scheduler_follows_megatrons_schedule(dummy_scheduler_run, name) -> None:
    """Accelerate's MegatronLMDummyScheduler in prepare: Megatron's warm-up + cosine lrs, stepped per DP process."""
    dummy_scheduler_run.assert_passed(name)


@pytest.fixture(scope="module", params=[2, 4], ids=["2_processes", "4_processes"])
def pp_run(request, torchrun_checks, tmp_path_factory):
    """2 processes: PP=2 (1F1B) and PP=2 x 2 virtual stages (interleaved) through Megatron-core's schedules, 20 steps
    within 1e-5 of one process, checkpoint replay, the CPU refusal naming megatron-core's CUDA calls, bf16 stages.
    4 processes: TP=2 x PP=2 likewise. A check of the other launch is reported skipped."""
    folder = tmp_path_factory.mktemp(f"pp{request.param}")
    return torchrun_checks(PP_SCRIPT, str(folder), nproc=request.param, timeout=300)


@pytest.mark.parametrize("name", checks_in(PP_SCRIPT))
def test_pipeline_stages_follow_one_process(pp_run, name) -> None:
    pp_run.assert_passed(name)
