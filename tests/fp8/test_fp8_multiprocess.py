"""fp8 (torchao) under torchrun, gloo on CPU: fp8_checks.py on 2-process DDP and on 4-process TP=2 x FSDP2=2.

Each run: fp8 loss curve within 5 % (relative, every step) of the bf16 run of the same MLP; the conversion
report; optimizer re-mapped; save_state -> load_state gives identical outputs; save_model writes plain
weights that load into the unconverted model; a recipe handler without fp8 fails on every rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from checkrun import checks_in

HERE = Path(__file__).resolve().parent


SCRIPT = HERE / "fp8_checks.py"


@pytest.fixture(scope="module", params=[("ddp", 2), ("tp_fsdp", 4)], ids=["ddp", "tp_fsdp"])
def fp8_run(request, torchrun_checks, tmp_path_factory):
    """One launch per layout: 2-process DDP, 4-process TP=2 x FSDP2=2."""
    layout, nproc = request.param
    return torchrun_checks(SCRIPT, str(tmp_path_factory.mktemp(f"fp8_{layout}")), layout, nproc=nproc, timeout=600)


@pytest.mark.parametrize("name", checks_in(SCRIPT))
def test_fp8_trains_like_bf16_saves_and_loads(fp8_run, name):
    fp8_run.assert_passed(name)
