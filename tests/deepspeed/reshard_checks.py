"""ZeRO-1/2/3 checkpoints loaded by another number of processes: 2 -> 1 and 1 -> 2, in two concurrent launches.

    torchrun --nproc_per_node 2 tests/deepspeed/reshard_checks.py <tmp_dir> &
    python tests/deepspeed/reshard_checks.py <tmp_dir>

Both start together (test_deepspeed_runs.py does), so their imports overlap. Each first saves, for
every case, a checkpoint of its own process count: it trains ``SAVE_AFTER`` steps, saves, trains
``CONTINUE`` more and records what it saw (weights at the save, the next losses, the final weights)
in ``<case>_world<n>.record.pt``, written once the checkpoint is complete. Then it waits for the
other launch's records and loads each of its checkpoints into a model with other weights; it must
see the same: same weights after the load, same next losses (Adam's moments and step count are
restored: a new AdamW would give other losses), same final weights. Every step uses the same
global batch whatever the number of processes (each process takes its slice), so the
trajectories are comparable. The 2-process side also loads a checkpoint that cannot be converted:
a clear error on both processes, the engine untouched.
test_deepspeed_runs.py starts it through two_process_checks.py and one_process_checks.py, after their other checks.
Each ``@check`` is one test of test_deepspeed_runs.py, per launch (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from functools import cache
from pathlib import Path

import ds_testlib as T
import torch
import torch.distributed as dist
import torch.nn.functional as F
from checklist import check, expect, run_checks, skip

from accel_core import Accelerator
from accel_deepspeed import DeepSpeedPlugin

TMP = Path(sys.argv[1])
GLOBAL_BATCH, SAVE_AFTER, CONTINUE = 8, 3, 3
PEER_TIMEOUT = 240  # seconds to wait for the other launch's checkpoints
FIGURES: dict[str, object] = {}
# name -> zero_optimization section. Threshold 0: even this small model is partitioned under ZeRO-3.
CASES = {
    "zero1": {"stage": 1},
    "zero2": {"stage": 2},
    "zero3": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero2_offload": {"stage": 2, "offload_optimizer": {"device": "cpu"}},  # DeepSpeedCPUAdam's state
}


def build(case: str, seed: int):
    config = {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // dist.get_world_size(),
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": CASES[case],
    }
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
    model = T.mlp(seed)
    engine, optimizer = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=T.LR))
    return accelerator, engine, optimizer


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = T.regression_data()[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH]
    share = GLOBAL_BATCH // dist.get_world_size()
    mine = slice(dist.get_rank() * share, (dist.get_rank() + 1) * share)
    return x[mine], y[mine]


def train(accelerator, engine, optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        x, y = global_batch(step)
        loss = F.mse_loss(engine(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return T.mean_over_ranks(losses)


def full_weights(engine) -> dict[str, torch.Tensor]:
    """Every parameter whole (gathered under ZeRO-3), in fp32."""
    import deepspeed

    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        return {name: p.detach().float().clone() for name, p in engine.module.named_parameters()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    expect(sorted(a) == sorted(b), f"parameter names {sorted(a)} vs {sorted(b)}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def save_and_record(case: str) -> None:
    accelerator, engine, optimizer = build(case, seed=0)
    train(accelerator, engine, optimizer, range(SAVE_AFTER))
    accelerator.save_state(TMP / f"{case}_world{dist.get_world_size()}")
    record = {"saved": full_weights(engine)}
    record["losses"] = train(accelerator, engine, optimizer, range(SAVE_AFTER, SAVE_AFTER + CONTINUE))
    record["final"] = full_weights(engine)
    if dist.get_rank() == 0:
        # Renamed into place: the other launch starts loading as soon as the record exists.
        name = TMP / f"{case}_world{dist.get_world_size()}.record.pt"
        torch.save(record, f"{name}.partial")
        os.replace(f"{name}.partial", name)
    accelerator.wait_for_everyone()


def load_and_compare(case: str, saved_world: int) -> None:
    name = f"{case}_{saved_world}to{dist.get_world_size()}"
    record = torch.load(TMP / f"{case}_world{saved_world}.record.pt", weights_only=True)
    accelerator, engine, optimizer = build(case, seed=7)  # other weights, to be overwritten
    expect(max_diff(full_weights(engine), record["saved"]) > 1e-2, "the fresh model must start from other weights")
    accelerator.load_state(TMP / f"{case}_world{saved_world}")
    after_load = FIGURES[f"{name}_weights_after_load"] = max_diff(full_weights(engine), record["saved"])
    losses = train(accelerator, engine, optimizer, range(SAVE_AFTER, SAVE_AFTER + CONTINUE))
    final = FIGURES[f"{name}_final_weights"] = max_diff(full_weights(engine), record["final"])
    FIGURES[f"{name}_losses"] = losses
    expect(after_load < 1e-6, f"{name}: weights after load_state differ by {after_load}")
    expect(
        T.close(losses, record["losses"], 1e-5, 1e-6), f"{name}: losses after load_state {losses} vs {record['losses']}"
    )
    expect(final < 1e-5, f"{name}: weights after continuing differ by {final}")
    expect(
        not T.close(fresh_adam_losses(record["saved"]), record["losses"], 1e-3, 1e-4),
        "losses must depend on Adam's state",
    )


def fresh_adam_losses(weights: dict[str, torch.Tensor]) -> list[float]:
    """The continuation with the saved weights but a new AdamW: what losing the moments would give."""
    model = T.mlp()
    model.load_state_dict(weights)
    optimizer = torch.optim.AdamW(model.parameters(), lr=T.LR)
    losses = []
    for step in range(SAVE_AFTER, SAVE_AFTER + CONTINUE):
        x, y = T.regression_data()[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH]
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def expect_failed_conversion_raises_everywhere(saved_world: int) -> None:
    """A checkpoint that cannot be converted: a clear error on every process, none left waiting."""
    from accel_checkpoint.errors import CheckpointError, CheckpointMismatchError

    broken = TMP / f"zero2_world{saved_world}_broken"
    if dist.get_rank() == 0:
        shutil.copytree(TMP / f"zero2_world{saved_world}", broken)
        shutil.rmtree(broken / "sharded" / "universal", ignore_errors=True)
        (broken / "sharded" / "model_0" / "mp_rank_00_model_states.pt").unlink()
    dist.barrier()
    accelerator, engine, _ = build("zero2", seed=7)
    before = full_weights(engine)
    try:
        accelerator.load_state(broken)
    except CheckpointError as error:  # process 0's own error; the others get it through accel-checkpoint's agreement
        message = str(error)
        expect(isinstance(error, CheckpointMismatchError) or "process 0" in message, f"unexpected error {error!r}")
        expect(f"saved by {saved_world} processes and {dist.get_world_size()} run now" in message, message)
        expect("ds_to_universal" in message, f"the error should name the manual conversion: {message}")
    else:
        raise AssertionError("loading a checkpoint that cannot be converted must raise")
    expect(max_diff(full_weights(engine), before) == 0.0, "a failed conversion must leave the engine untouched")
    FIGURES[f"failed_conversion_error_rank{dist.get_rank()}"] = message[:160]


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + PEER_TIMEOUT
    while not path.exists():
        expect(time.monotonic() < deadline, f"{path} did not appear within {PEER_TIMEOUT}s: did the other launch fail?")
        time.sleep(0.5)


@cache
def world() -> int:
    Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=1))  # starts the process group (of one under plain python)
    return dist.get_world_size()


@check
def every_case_saves_a_checkpoint_of_its_own_process_count() -> None:
    world()
    for case in CASES:
        start = time.perf_counter()
        save_and_record(case)
        FIGURES[f"seconds_save_{case}"] = round(time.perf_counter() - start, 1)


@check
def every_case_loads_the_other_launchs_checkpoint() -> None:
    other = 3 - world()
    for case in CASES:
        wait_for(TMP / f"{case}_world{other}.record.pt")
        start = time.perf_counter()
        load_and_compare(case, other)
        FIGURES[f"seconds_load_{case}"] = round(time.perf_counter() - start, 1)


@check
def a_checkpoint_that_cannot_be_converted_fails_on_both_processes() -> None:
    if world() != 2:
        skip("the 2-process launch loads it")
    expect_failed_conversion_raises_everywhere(saved_world=1)


def print_figures() -> None:
    """The figures the test module reads, printed once every check has run."""
    if dist.get_rank() == 0:
        print("FIGURES " + json.dumps(FIGURES), flush=True)


if __name__ == "__main__":
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    run_checks(teardown=print_figures)
