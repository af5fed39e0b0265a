"""Real Megatron-core tensor, data and pipeline parallelism on CPU (gloo): one 2-process launch (two_process_checks.py:
pp_checks.py's, tp_checks.py's and dummy_scheduler_checks.py's checks) and one 4-process launch of pp_checks.py; each
check one test of the script's own test function."""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in, declared_checks, run_check_script, torchrun_command

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
TP_SCRIPT = HERE / "tp_checks.py"
DUMMY_SCHEDULER_SCRIPT = HERE / "dummy_scheduler_checks.py"
PP_SCRIPT = HERE / "pp_checks.py"
TWO_PROCESS_DRIVER = HERE / "two_process_checks.py"


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """pp_checks.py's 2-process checks, tp_checks.py's and dummy_scheduler_checks.py's, in one launch (one torch and
    Megatron import per process instead of three)."""
    folder = str(tmp_path_factory.mktemp("megatron2"))
    # The driver imports the scripts in this order; the harness checks that the launch ran exactly these checks.
    names = [*declared_checks(PP_SCRIPT), *declared_checks(TP_SCRIPT), *declared_checks(DUMMY_SCHEDULER_SCRIPT)]
    return run_check_script(
        torchrun_command(TWO_PROCESS_DRIVER, folder, nproc=2),
        TWO_PROCESS_DRIVER,
        nproc=2,
        timeout=400,
        results=tmp_path_factory.mktemp("megatron2-results"),
        names=names,
    )


@pytest.mark.parametrize("name", checks_in(TP_SCRIPT))
def test_tensor_and_data_parallel_follow_plain_torch(two_process_run, name) -> None:
    """TP=2 vs the unsplit model (AdamW, clipping), RNG streams, full-weight export, checkpoint replay,
    DP=2 vs torch DDP, and the refused settings (distributed optimizer, tp_degree=3, another TP degree on load)."""
    two_process_run.assert_passed(name)


@pytest.mark.parametrize("name", checks_in(DUMMY_SCHEDULER_SCRIPT))
def test_megatron_dummy_scheduler_follows_megatrons_schedule(two_process_run, name) -> None:
    """Accelerate's MegatronLMDummyScheduler in prepare: Megatron's warm-up + cosine lrs, stepped per DP process."""
    two_process_run.assert_passed(name)


@pytest.fixture(scope="module", params=[2, 4], ids=["2_processes", "4_processes"])
def pp_run(request, torchrun_checks, tmp_path_factory):
    """2 processes: PP=2 (1F1B) and PP=2 x 2 virtual stages (interleaved) through Megatron-core's schedules, 20 steps
    within 1e-5 of one process, checkpoint replay, the CPU refusal naming megatron-core's CUDA calls, bf16 stages
    (the 2-process launch above). 4 processes: TP=2 x PP=2 likewise. A check of the other launch is reported skipped."""
    if request.param == 2:
        return request.getfixturevalue("two_process_run")
    folder = tmp_path_factory.mktemp(f"pp{request.param}")
    return torchrun_checks(PP_SCRIPT, str(folder), nproc=request.param, timeout=300)


@pytest.mark.parametrize("name", checks_in(PP_SCRIPT))
def test_pipeline_stages_follow_one_process(pp_run, name) -> None:
    pp_run.assert_passed(name)
