"""Pipeline parallelism, for real: one 4-process launch (gloo, CPU) through the pipeline layouts.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 4 tests/pipeline/pipeline_checks.py <folder>

Each layout trains a small transformer (pipemodel.py) for 10 steps through
``accelerator.forward_backward`` and follows the same model trained on one process (every rank
trains that reference locally on the global batch): losses and global gradient norms (clipped at
1.0) within 1e-5 in fp32. Layouts: PP2 x DP2 with GPipe, with 1F1B and 2-step gradient
accumulation, PP2 x TP2, PP2 x FSDP2 with interleaved 1F1B (2 virtual stages per rank), PP4 with
1F1B. Then, per layout: parameter bytes per rank ~ 1/stages of the whole model; an evaluation
forward gives every rank the reference's logits and ``gather_for_metrics`` returns each sample
once; ``get_state_dict`` gathers the whole trained model, equal to the reference's. A forward in
training mode fails with the same error on every rank; with 2 stages per rank, ``save_state`` then
``load_state`` replays the next steps exactly. A PP2 x DP2 ``save_state`` (DCP, each
stage its own keys) continues exactly after ``load_state`` on the same layout, and within 1e-5
on PP4. Each ``@check`` is one test of test_pipeline_multiprocess.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from pipemodel import SEQ, lm_loss, make_model, token_data
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DataLoaderConfiguration, ParallelismConfig
from accel_fsdp import FullyShardedDataParallelPlugin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multiprocess"))
from layout_checks import RANK, global_batch, mean_over_world, say

warnings.filterwarnings("ignore", message=".*may not have complete support.*")

# 10 steps (5 optimizer steps with accumulation 2): a wrong schedule, reduction or stage's optimizer state shows from
# the first steps; PP2 x TP2 and the interleaved layout cost ~0.3-0.5 s a step on CPU, and 20 steps doubled that.
STEPS, LR, MAX_NORM, TOL = 10, 1e-2, 1.0, 1e-5
SPLIT = DataLoaderConfiguration(split_batches=True)  # the loader's batch (8) is the global batch on every layout


def run_layout(name: str, config: ParallelismConfig, accumulation: int = 1, **kwargs) -> None:
    accelerator = Accelerator(
        dataloader_config=SPLIT, parallelism_config=config, gradient_accumulation_steps=accumulation, **kwargs
    )
    model, reference = make_model(), make_model()
    whole_bytes = sum(p.numel() * p.element_size() for p in reference.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)  # built before prepare: rebuilt on this rank's stages
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(token_data(8 * STEPS)), batch_size=8, shuffle=True)
    # 12 samples in batches of 4: 2 per dp rank, fewer than the interleaved schedule's 4 micro-batches (padded).
    evaluation = DataLoader(TensorDataset(token_data(12, seed=7)), batch_size=4)
    torch.manual_seed(1000 + RANK)  # every process differently: the prepared loader must still agree
    model, optimizer, loader, evaluation = accelerator.prepare(model, optimizer, loader, evaluation)
    expect(accelerator.pipeline_parallel_rank == model.layout.rank, f"{name}: pipeline_parallel_rank")

    stages = accelerator.parallelism_config.size("pp") * (config.pp_stages_per_rank or 1)
    local = torch.tensor([float(sum(stage_bytes(model)))])
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    share = local.item() / whole_bytes
    dense = accelerator.parallelism_config.size("tp") * accelerator.parallelism_config.size("dp_shard")
    expect(share < 1.5 / (stages // (config.pp_stages_per_rank or 1)) / dense, f"{name}: {share:.3f} of the model")

    worst_loss = worst_norm = 0.0
    for (batch,) in loader:
        reference_batch = global_batch(accelerator, batch)
        with accelerator.accumulate(model):
            loss = accelerator.forward_backward(model, batch[:, :-1], batch[:, 1:], lm_loss)
            norm = accelerator.clip_grad_norm_(model.parameters(), MAX_NORM) if accelerator.sync_gradients else None
            optimizer.step()
            optimizer.zero_grad()
        ref_loss = lm_loss(reference(reference_batch[:, :-1]), reference_batch[:, 1:])
        (ref_loss / accumulation).backward()
        worst_loss = max(worst_loss, abs(mean_over_world(loss) - ref_loss.item()))
        if norm is not None:
            ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
            ref_optimizer.step()
            ref_optimizer.zero_grad()
            worst_norm = max(worst_norm, abs(norm.item() - ref_norm.item()))
    expect(worst_loss <= TOL, f"{name}: loss differs from one process by {worst_loss:.2e}")
    expect(worst_norm <= TOL, f"{name}: global grad norm differs from one process by {worst_norm:.2e}")

    model.eval()
    reference.eval()
    worst_eval, seen = 0.0, 0
    with torch.no_grad():
        for (batch,) in evaluation:
            logits = accelerator.gather_for_metrics(model(batch[:, :-1]))
            expected = reference(accelerator.gather_for_metrics(batch)[:, :-1])
            worst_eval = max(worst_eval, (logits - expected).abs().max().item())
            seen += logits.shape[0]
    # Logits (magnitude ~10) after training; tensor parallelism sums in another order: 1e-4 absolute.
    expect(seen == 12 and worst_eval <= 1e-4, f"{name}: evaluation saw {seen} samples, off by {worst_eval:.2e}")

    full = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        expected_state = reference.state_dict()
        expect(sorted(full) == sorted(expected_state), f"{name}: state dict keys {sorted(full)[:4]}...")
        worst_state = max((full[k] - expected_state[k]).abs().max().item() for k in expected_state)
        expect(worst_state <= 1e-4, f"{name}: gathered weights differ from one process by {worst_state:.2e}")
    say(
        f"LAYOUT {name}: {accelerator.parallelism_config.describe()} schedule={config.pp_schedule} "
        f"strategy={accelerator.strategy.name} steps={STEPS} max|dloss|={worst_loss:.2e} max|dnorm|={worst_norm:.2e} "
        f"eval max|dlogits|={worst_eval:.2e} parameter bytes/rank={share:.3f} of the model"
    )
    training_forward_refused(accelerator, model)
    if len(model.parts) > 1:
        interleaved_checkpoint_replays(accelerator, model, optimizer)
    accelerator.free_memory()


def interleaved_checkpoint_replays(accelerator: Accelerator, model, optimizer) -> None:
    """save_state with several stages per rank (each rank's stages written under the whole model's names), two more
    steps, load_state: the same two steps again, bit for bit (weights and optimizer state came back)."""
    model.train()
    dp = accelerator.parallel_dims.dp
    rows = token_data(8, seed=11).chunk(dp.size)[dp.rank]

    def two_steps() -> list[float]:
        losses = []
        for _ in range(2):
            loss = accelerator.forward_backward(model, rows[:, :-1], rows[:, 1:], lm_loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(mean_over_world(loss))
        return losses

    folder = os.path.join(sys.argv[1], "interleaved")
    accelerator.save_state(folder)
    expected = two_steps()
    accelerator.load_state(folder)
    again = two_steps()
    expect(again == expected, f"interleaved checkpoint: continuation {again} != {expected}")
    say("INTERLEAVED CHECKPOINT: save, 2 steps, load, the same 2 steps exactly")


def meta_device_construction() -> None:
    """A model built on the meta device: each rank allocates and initialises its stage only, then trains."""
    accelerator = Accelerator(parallelism_config=ParallelismConfig(pp_size=2))
    with torch.device("meta"):
        model = make_model()
    whole_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    tensors = [t for stage in model.stage_modules for t in [*stage.parameters(), *stage.buffers()]]
    expect(not any(t.is_meta for t in tensors), "meta tensors left after prepare")
    expect(all(bool(torch.isfinite(t).all()) for t in tensors), "uninitialised stage tensors")
    from accel_core.pipelining import parameter_bytes

    share = parameter_bytes(model.stage_modules) / whole_bytes
    expect(share < 0.6, f"a meta-built stage holds {share:.3f} of the model")
    data = token_data(8 * 8, seed=3)
    losses = []
    for step in range(8):
        rows = data[step * 8 : (step + 1) * 8].chunk(2)[accelerator.parallel_dims.dp.rank]
        losses.append(accelerator.forward_backward(model, rows[:, :-1], rows[:, 1:], lm_loss).item())
        optimizer.step()
        optimizer.zero_grad()
    expect(losses[-1] < losses[0], f"a meta-built pipeline does not train: {losses}")
    accelerator.free_memory()
    say(f"META-DEVICE PIPELINE: stage holds {share:.3f} of the model, loss {losses[0]:.3f} -> {losses[-1]:.3f}")


def stage_bytes(model) -> list[int]:
    from accel_core.pipelining import parameter_bytes

    return [parameter_bytes(model.stage_modules)]


def training_forward_refused(accelerator: Accelerator, model) -> None:
    model.train()
    try:
        model(torch.zeros(4, SEQ, dtype=torch.long))
    except RuntimeError as error:
        expect("accelerator.forward_backward" in str(error), f"unexpected message {error}")
    else:
        raise AssertionError(f"[rank {RANK}] a training-mode forward of a pipelined model ran")
    dist.barrier()
    say("TRAINING FORWARD REFUSED ON EVERY RANK")


def checkpoint_round_trip(folder: str) -> None:
    """save_state on PP2 x DP2 (1F1B) after 6 steps; loads continue exactly on the same layout, within 1e-5 on PP4."""
    data = token_data(8 * 10, seed=99)

    def setup(config: ParallelismConfig, seed: int):
        accelerator = Accelerator(parallelism_config=config)
        model = make_model(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        model, optimizer = accelerator.prepare(model, optimizer)
        return accelerator, model, optimizer

    def train(accelerator, model, optimizer, steps: range) -> list[float]:
        dp = accelerator.parallel_dims.dp
        losses = []
        for step in steps:
            rows = data[step * 8 : (step + 1) * 8].chunk(dp.size)[dp.rank]
            loss = accelerator.forward_backward(model, rows[:, :-1], rows[:, 1:], lm_loss)
            accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(mean_over_world(loss))
        return losses

    same = ParallelismConfig(pp_size=2, pp_schedule="1f1b")
    accelerator, model, optimizer = setup(same, 0)
    train(accelerator, model, optimizer, range(6))
    accelerator.save_state(folder)
    expected = train(accelerator, model, optimizer, range(6, 10))
    accelerator.free_memory()
    accelerator, model, optimizer = setup(same, 5)  # other initial weights: all must come from the checkpoint
    accelerator.load_state(folder)
    again = train(accelerator, model, optimizer, range(6, 10))
    expect(again == expected, f"same-layout continuation {again} != {expected}")
    accelerator.free_memory()
    accelerator, model, optimizer = setup(ParallelismConfig(pp_size=4, pp_schedule="1f1b"), 5)
    accelerator.load_state(folder)
    other = train(accelerator, model, optimizer, range(6, 10))
    worst = max(abs(a - b) for a, b in zip(other, expected, strict=True))
    expect(worst <= TOL, f"PP4 continuation of a PP2 x DP2 checkpoint differs by {worst:.2e}")
    accelerator.free_memory()
    say(f"CHECKPOINT PP2xDP2 -> same layout exact, -> PP4 max|dloss|={worst:.2e}")


@check
def a_pp2_x_dp2_checkpoint_continues_on_the_same_layout_and_on_pp4() -> None:
    checkpoint_round_trip(os.path.join(sys.argv[1], "pp_checkpoint"))


@check
def a_meta_device_model_builds_each_stage_on_its_rank() -> None:
    meta_device_construction()


@check
def pp2_x_dp2_gpipe_follows_one_process() -> None:
    run_layout("PP2xDP2-gpipe", ParallelismConfig(pp_size=2, pp_schedule="gpipe"))


@check
def pp2_x_dp2_1f1b_with_accumulation_follows_one_process() -> None:
    run_layout("PP2xDP2-1f1b-accumulate2", ParallelismConfig(pp_size=2, pp_schedule="1f1b"), accumulation=2)


@check
def pp2_x_tp2_1f1b_follows_one_process() -> None:
    run_layout("PP2xTP2-1f1b", ParallelismConfig(pp_size=2, tp_size=2, pp_schedule="1f1b", pp_microbatches=4))


@check
def pp2_x_fsdp2_interleaved_follows_one_process() -> None:
    run_layout(
        "PP2xFSDP2-interleaved",
        ParallelismConfig(pp_size=2, dp_shard_size=2, pp_schedule="interleaved_1f1b", pp_stages_per_rank=2),
        fsdp_plugin=FullyShardedDataParallelPlugin(),
    )


@check
def pp4_1f1b_follows_one_process() -> None:
    run_layout("PP4-1f1b", ParallelismConfig(pp_size=4, pp_schedule="1f1b"))


if __name__ == "__main__":
    run_checks(teardown=dist.destroy_process_group)
