"""fp8 (torchao) under torchrun, gloo on CPU: fp8_checks.py on 2-process DDP and on 4-process TP=2 x FSDP2=2.

Each run: fp8 loss curve within 5 % (relative, every step) of the bf16 run of the same MLP; the conversion
report; optimizer re-mapped; save_state -> load_state gives identical outputs; save_model writes plain
weights that load into the unconverted model; a recipe handler without fp8 fails on every rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "nproc"), [("ddp", 2), ("tp_fsdp", 4)])
def test_fp8_trains_like_bf16_saves_and_loads(torchrun, tmp_path, layout, nproc):
    result = torchrun(HERE / "fp8_checks.py", str(tmp_path), layout, nproc=nproc, timeout=600)
    assert all(f"FP8 CHECKS PASSED {rank}" in result.stdout for rank in range(nproc)), result.stdout[-3000:]
    for line in (
        f"LOSS {layout}",
        f"SAVE/LOAD STATE {layout}: identical outputs",
        f"SAVE_MODEL {layout}",
        "ERROR ON EVERY RANK",
    ):
        assert line in result.stdout, result.stdout[-3000:]
