"""Mesh-first parallelism, for real: one 4-process launch (gloo, CPU) through every layout.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 4 tests/parallelism/mesh_checks.py <folder>

For TP2 x FSDP2, HSDP 2 x 2, TP2 x DDP2, TP4 and FSDP2 on a 2-D mesh given in the plugin, a small
Llama-style model follows the same model trained on one process (each rank trains that reference
locally on the global batch the layout saw): losses and global gradient norms within 1e-5 for
10 steps in fp32. Processes are seeded differently, yet tensor-parallel peers receive identical
batches and data-parallel ranks partition each global batch; ``gather_for_metrics`` returns every
evaluation sample exactly once. Then: bad layouts fail with a clear error on every rank; context
parallelism builds its mesh and splits the batch (its CPU attention is unsupported by torch);
a TP2 x FSDP2 checkpoint resumes bit-identically on the same layout and within 1e-6 on FSDP4
(the one-process continuation is checked by single_process_load.py from the numbers written here).
Each ``@check`` is one test of test_mesh_multiprocess.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from tinyllama import SEQ, loss_of, make_model, token_data
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, DataLoaderConfiguration, ParallelismConfig
from accel_fsdp import FullyShardedDataParallelPlugin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multiprocess"))
from layout_checks import RANK, global_batch, mean_over_world, say

# torch's own notices, not failures: FSDP2 seeing the replicated logits view, DTensor's CPU random ops.
warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
warnings.filterwarnings("ignore", message=".*may not have complete support.*")

FOLDER = sys.argv[1]
# 10 steps: a wrong reduction, scale or sharded optimizer state shows from the first steps (AdamW's moments from the
# second); each tensor-parallel step costs ~0.3 s of DTensor dispatch on CPU, and 20 steps doubled that for no new case.
STEPS, LR, MAX_NORM, TOL = 10, 1e-2, 1.0, 1e-5
SPLIT = DataLoaderConfiguration(split_batches=True)  # the loader's batch (8) is the global batch on every layout


def local_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.parameters()) + [
        v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()
    ]
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


def run_layout(name: str, steps: int = STEPS, **accelerator_kwargs) -> None:
    accelerator = Accelerator(dataloader_config=SPLIT, **accelerator_kwargs)
    model, reference = make_model(), make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)  # built before prepare: rebuilt on the new parameters
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(token_data(8 * steps)), batch_size=8, shuffle=True)
    evaluation = DataLoader(TensorDataset(torch.arange(10)), batch_size=4)  # 10 samples: the last batch is short
    torch.manual_seed(1000 + RANK)  # every process differently: the prepared loader must still agree
    model, optimizer, loader, evaluation = accelerator.prepare(model, optimizer, loader, evaluation)
    worst_loss = worst_norm = 0.0
    for (batch,) in loader:
        reference_batch = global_batch(accelerator, batch)
        loss = loss_of(model, batch)
        accelerator.backward(loss)
        norm = accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        ref_loss = loss_of(reference, reference_batch)
        ref_loss.backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), MAX_NORM)
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        worst_loss = max(worst_loss, abs(mean_over_world(loss) - ref_loss.item()))
        worst_norm = max(worst_norm, abs(norm.item() - ref_norm.item()))
    expect(worst_loss <= TOL, f"{name}: loss differs from one process by {worst_loss:.2e}")
    expect(worst_norm <= TOL, f"{name}: global grad norm differs from one process by {worst_norm:.2e}")
    seen: list[int] = []
    for (ids,) in evaluation:
        seen += accelerator.gather_for_metrics(ids).tolist()
    expect(seen == list(range(10)), f"{name}: gather_for_metrics gave {seen}")
    nbytes = torch.tensor([float(local_bytes(model, optimizer))])
    dist.all_reduce(nbytes, op=dist.ReduceOp.MAX)
    say(
        f"LAYOUT {name}: {accelerator.parallelism_config.describe()} strategy={accelerator.strategy.name} "
        f"steps={steps} max|dloss|={worst_loss:.2e} max|dnorm|={worst_norm:.2e} max bytes/rank={int(nbytes.item())}"
    )
    accelerator.free_memory()


def expect_error(what: str, fragment: str, action) -> None:
    try:
        action()
    except ValueError as error:
        expect(fragment in str(error), f"{what}: unexpected message {error}")
    else:
        raise AssertionError(f"[rank {RANK}] {what}: no error")
    dist.barrier()  # every rank raised and got here: no rank is left waiting in a collective
    say(f"ERROR ON EVERY RANK: {what}")


def layout_from_launcher_variables() -> None:
    """What `accel launch --dp-shard-size 2 --tp-size 2` writes, read by a plain Accelerator()."""
    os.environ.update({"ACCEL_DP_SHARD_SIZE": "2", "ACCEL_TP_SIZE": "2"})
    try:
        accelerator = Accelerator()
    finally:
        del os.environ["ACCEL_DP_SHARD_SIZE"], os.environ["ACCEL_TP_SIZE"]
    dims = accelerator.parallel_dims
    expect(
        accelerator.strategy.name == "fsdp" and (dims.dp.size, dims.tp.size) == (2, 2), f"layout from ACCEL_*: {dims}"
    )
    expect(
        accelerator.device_mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "tp"), f"mesh {accelerator.device_mesh}"
    )
    say("LAYOUT FROM ACCEL_* VARIABLES: fsdp, dp_shard=2 x tp=2")


def bad_layouts() -> None:
    expect_error(
        "product != world",
        "but the job has 4",
        lambda: Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=3)),
    )
    expect_error(
        "sizes over the world",
        "need a multiple of 8 processes",
        lambda: Accelerator(parallelism_config=ParallelismConfig(dp_replicate_size=2, tp_size=4)),
    )
    expect_error(
        "pipeline schedule with virtual stages",
        "runs one stage per rank",
        lambda: Accelerator(parallelism_config=ParallelismConfig(pp_size=2, pp_schedule="gpipe", pp_stages_per_rank=2)),
    )

    def tp_not_dividing() -> None:
        accelerator = Accelerator(parallelism_config=ParallelismConfig(tp_size=4, tp_plan={"0": "colwise"}))
        accelerator.prepare(nn.Sequential(nn.Linear(8, 6)))

    expect_error("tp does not divide a layer", "tp_size=4 must divide 0.out_features=6", tp_not_dividing)

    def cp_without_sdpa() -> None:
        accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2))
        accelerator.prepare(nn.Sequential(nn.Linear(8, 8)))

    expect_error(
        "cp on a model without SDPA", "never calls torch.nn.functional.scaled_dot_product_attention", cp_without_sdpa
    )

    def deepspeed_with_mesh() -> None:
        from accel_deepspeed import DeepSpeedPlugin

        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), parallelism_config=ParallelismConfig(tp_size=2))

    expect_error("a mesh with DeepSpeed", "DeepSpeed strategy cannot honour tp_size=2", deepspeed_with_mesh)
    expect_error(
        "FSDP1 with tensor parallelism",
        "cannot compose",
        lambda: Accelerator(
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1), parallelism_config=ParallelismConfig(tp_size=2)
        ),
    )
    expect_error(
        "DDP asked to shard",
        "needs FSDP2",
        lambda: Accelerator(strategy="ddp", parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2)),
    )


def context_parallel() -> None:
    """cp=2 x dp_shard=2: the mesh, the batches (cp peers alike), the sequence split; attention needs a GPU."""
    accelerator = Accelerator(dataloader_config=SPLIT, parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2))
    dims = accelerator.parallel_dims
    expect((dims.dp.size, dims.cp.size, accelerator.strategy.device_mesh.size()) == (2, 2, 4), "cp mesh")
    model = accelerator.prepare(make_model())
    loader = accelerator.prepare(DataLoader(TensorDataset(token_data(16, seed=5)), batch_size=8))
    batch = next(iter(loader))[0]
    global_batch(accelerator, batch)  # cp peers read the same rows
    tokens = batch[:, :SEQ].contiguous()
    original = tokens.clone()
    with accelerator.maybe_context_parallel(buffers=[tokens], buffer_seq_dims=[1]):
        expect(tokens.shape[1] == SEQ // 2, f"cp shard of the sequence has {tokens.shape[1]} tokens")
        pieces: list = [None] * 2
        dist.all_gather_object(pieces, tokens.tolist(), group=dims.cp.group)
        # torch's load balancing: of 4 chunks, cp rank 0 holds chunks 0 and 3, cp rank 1 chunks 1 and 2.
        q = SEQ // 4
        rebuilt = [a[:q] + b[:q] + b[q:] + a[q:] for a, b in zip(*pieces, strict=True)]
        expect(rebuilt == original.tolist(), "the cp shards do not make up the sequence")
        try:
            model(tokens)
        except NotImplementedError as error:  # torch shards only its GPU attention kernels
            expect("sharding strategy" in str(error), f"unexpected CPU attention error: {error}")
        else:
            raise AssertionError("context-parallel attention ran on the CPU: update the docs, torch supports it now")
    expect(torch.equal(tokens, original), "the buffer was not restored after the block")
    say("CONTEXT PARALLEL: mesh, batches and sequence split checked (attention needs a GPU)")
    accelerator.free_memory()


def checkpoint_round_trip() -> None:
    folder, export = os.path.join(FOLDER, "ckpt"), os.path.join(FOLDER, "export")

    def setup(config: ParallelismConfig, seed: int):
        accelerator = Accelerator(dataloader_config=SPLIT, parallelism_config=config)
        model = make_model(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        loader = DataLoader(TensorDataset(token_data(64, seed=9)), batch_size=8, shuffle=True)
        return accelerator, *accelerator.prepare(model, optimizer, loader)

    def train(accelerator, model, optimizer, iterator, steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            (batch,) = next(iterator)
            loss = loss_of(model, batch)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(mean_over_world(loss))
        return losses

    tp_fsdp = ParallelismConfig(dp_shard_size=2, tp_size=2)
    accelerator, model, optimizer, loader = setup(tp_fsdp, seed=0)
    iterator = iter(loader)
    train(accelerator, model, optimizer, iterator, 3)
    accelerator.save_state(folder)
    accelerator.save_model(model, export)  # full weights, gathered: model.safetensors
    expected = train(accelerator, model, optimizer, iterator, 5)
    accelerator.free_memory()

    accelerator, model, optimizer, loader = setup(tp_fsdp, seed=7)  # other weights: all must come from the checkpoint
    accelerator.load_state(folder)
    same = train(accelerator, model, optimizer, iter(loader), 5)
    expect(same == expected, f"TP2xFSDP2 -> TP2xFSDP2 continuation {same} != {expected}")
    accelerator.free_memory()

    accelerator, model, optimizer, loader = setup(ParallelismConfig(dp_shard_size=4), seed=7)
    accelerator.load_state(folder)
    other = train(accelerator, model, optimizer, iter(loader), 5)
    # Relative: fp32 losses near 4 are 4.8e-7 apart at the last bit; other reduction orders move a bit or two.
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(other, expected, strict=True))
    expect(worst <= 1e-6, f"TP2xFSDP2 -> FSDP4 continuation differs by {worst:.2e} (relative)")
    accelerator.free_memory()
    if RANK == 0:
        with open(os.path.join(FOLDER, "expected.json"), "w") as handle:
            json.dump({"losses": expected}, handle)
    say(f"CHECKPOINT: TP2xFSDP2 -> same layout bit-identical; -> FSDP4 max relative |dloss|={worst:.2e}")


@check
def tp2_x_fsdp2_follows_one_process() -> None:
    run_layout("TP2xFSDP2", parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))


@check
def hsdp_2_x_2_follows_one_process() -> None:
    run_layout("HSDP2x2", parallelism_config=ParallelismConfig(dp_replicate_size=2, dp_shard_size=2))


@check
def tp2_x_ddp2_with_activation_checkpointing_follows_one_process() -> None:
    # With activation checkpointing of each block (after tensor parallelism, before the replicas).
    run_layout(
        "TP2xDDP2", parallelism_config=ParallelismConfig(dp_replicate_size=2, tp_size=2, activation_checkpointing=True)
    )


@check
def tp4_follows_one_process() -> None:
    run_layout("TP4", parallelism_config=ParallelismConfig(tp_size=4))


@check
def fsdp2_on_a_2d_mesh_given_in_the_plugin_follows_one_process() -> None:
    # The latent bug: a 2-D mesh in the FSDP plugin used to shard data over the whole world.
    from torch.distributed.device_mesh import init_device_mesh

    plugin_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    run_layout(
        "FSDP2-plugin-mesh(dp_shard=2,tp=2)",
        steps=5,
        fsdp_plugin=FullyShardedDataParallelPlugin(device_mesh=plugin_mesh),
    )


@check
def the_layout_from_the_launchers_variables() -> None:
    layout_from_launcher_variables()


@check
def bad_layouts_fail_on_every_rank() -> None:
    bad_layouts()


@check
def context_parallelism_builds_its_mesh_and_splits_the_batch() -> None:
    context_parallel()


@check
def a_tp2_x_fsdp2_checkpoint_resumes_on_the_same_layout_and_on_fsdp4() -> None:
    checkpoint_round_trip()


if __name__ == "__main__":
    run_checks()
