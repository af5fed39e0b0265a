"""``save_state`` / ``load_state`` under Megatron TP + DP: one file set per TP shard, inside accel-checkpoint's folder.

accel-checkpoint calls ``save_sharded`` with the checkpoint's ``sharded/`` folder and a ``CheckpointIO`` (see
``accel_core.checkpointing``) and writes everything else around it (process
RNG, dataloader positions, schedulers, custom objects, metadata, the completion marker). Layout::

    sharded/megatron.json                 {"tp_degree", "pp_degree", "vp_degree", "dp_degree", "models", "optimizers"}
    sharded/tp_rank_<r>/model_<i>.pt      TP rank r's state dict of prepared model i (its weight shards)
                                          (tp_rank_<r>_pp_rank_<p>/ with pipeline stages: that stage's keys)
    sharded/tp_rank_<r>/optimizer_<i>.pt  the optimizer state of those shards
    sharded/tp_rank_<r>/rng_tracker.pt    Megatron's named RNG streams of TP rank r

Data-parallel replicas hold the same shard, so only DP rank 0 of each TP (x PP) rank writes; on load
every process reads its shard's files, so the number of DP replicas may change. The TP, PP and
virtual-stage degrees may not: another degree is a ``CheckpointMismatchError``. Files are read with
accel-checkpoint's safe loader (``io.load_torch_file``), and a failure on one process raises on all of them
(``io.coordinator.agree``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from megatron.core import parallel_state

from accel_core.checkpointing import MODELS, OPTIMIZERS, CheckpointMismatchError
from accel_core.optimizer import unwrap_optimizer

from . import rng

if TYPE_CHECKING:
    from accel_core.checkpointing import CheckpointIO
    from accel_core.strategies import PreparedObjects

METADATA = "megatron.json"


@dataclass(frozen=True)
class ShardLayout:
    """How the run splits its models (the strategy's plugin and mesh): written with the shards, and a checkpoint of
    other tensor, pipeline or virtual-pipeline degrees is refused at load (its shards do not fit)."""

    tp_degree: int
    pp_degree: int
    vp_degree: int
    dp_degree: int


def _shard_folder(folder: str) -> str:
    """This process's shard: its TP rank's, and with pipeline stages its (TP rank, PP rank)'s."""
    name = f"tp_rank_{parallel_state.get_tensor_model_parallel_rank():02d}"
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        name += f"_pp_rank_{parallel_state.get_pipeline_model_parallel_rank():02d}"
    return os.path.join(folder, name)


def _on_every_process(io: CheckpointIO, what: str, work: Callable[[], None]) -> None:
    """Runs ``work``; if it fails on any process, every process raises (none is left waiting in a collective)."""
    error: BaseException | None = None
    try:
        work()
    except Exception as caught:  # noqa: BLE001 - raised on every process by agree()
        error = caught
    io.coordinator.agree(error, what)


def save_sharded(
    layout: ShardLayout, first_process: bool, prepared: PreparedObjects, folder: str, io: CheckpointIO
) -> tuple[str, ...]:
    """Collective. ``first_process`` writes the layout; each data-parallel rank 0 its shard. Returns the categories
    covered."""
    _on_every_process(
        io,
        f"saving the Megatron shards in {folder}",
        lambda: _save_shard(layout, first_process, prepared, folder, io),
    )
    return (MODELS, OPTIMIZERS)


def _save_shard(
    layout: ShardLayout, first_process: bool, prepared: PreparedObjects, folder: str, io: CheckpointIO
) -> None:
    models, optimizers = [record.module for record in prepared.records], list(prepared.optimizers)
    if first_process:
        os.makedirs(folder, exist_ok=True)
        metadata = {
            "tp_degree": layout.tp_degree,
            "pp_degree": layout.pp_degree,
            "vp_degree": layout.vp_degree,
            "dp_degree": layout.dp_degree,
            "models": len(models),
            "optimizers": len(optimizers),
        }
        io.write_json(os.path.join(folder, METADATA), metadata)
    if parallel_state.get_data_parallel_rank() == 0:
        shard = _shard_folder(folder)
        os.makedirs(shard, exist_ok=True)
        for i, model in enumerate(models):
            torch.save(model.state_dict(), os.path.join(shard, f"model_{i}.pt"))
        for i, optimizer in enumerate(optimizers):
            torch.save(unwrap_optimizer(optimizer).state_dict(), os.path.join(shard, f"optimizer_{i}.pt"))
        torch.save(rng.tracker_states(), os.path.join(shard, "rng_tracker.pt"))


def load_sharded(layout: ShardLayout, prepared: PreparedObjects, folder: str, io: CheckpointIO) -> None:
    """Collective: restores this process's TP shard."""
    _on_every_process(io, f"loading the Megatron shards in {folder}", lambda: _load_shard(layout, prepared, folder, io))


def _load_shard(layout: ShardLayout, prepared: PreparedObjects, folder: str, io: CheckpointIO) -> None:
    path = os.path.join(folder, METADATA)
    if not os.path.isfile(path):
        raise CheckpointMismatchError(f"{path} is missing: this checkpoint was not written by the megatron strategy.")
    with open(path) as handle:
        saved = json.load(handle)
    ours = (layout.tp_degree, layout.pp_degree, layout.vp_degree)
    theirs = (saved["tp_degree"], saved.get("pp_degree", 1), saved.get("vp_degree", 1))
    if theirs != ours:
        raise CheckpointMismatchError(
            f"The checkpoint in {os.path.dirname(folder)} was saved with tp_degree={theirs[0]}, pp_degree={theirs[1]}, "
            f"vp_degree={theirs[2]}, this run uses tp_degree={ours[0]}, pp_degree={ours[1]}, vp_degree={ours[2]}: "
            f"its shards do not fit. Load it with MegatronLMPlugin(tp_degree={theirs[0]}, pp_degree={theirs[1]}, "
            f"vp_degree={theirs[2]}); to change the degrees, export full weights with accelerator.save_model(model, "
            "dir) in a run with the old degrees and load them with accelerator.strategy.load_model_state_dict(model, "
            "state_dict)."
        )
    models, optimizers = [record.module for record in prepared.records], list(prepared.optimizers)
    if (saved["models"], saved["optimizers"]) != (len(models), len(optimizers)):
        raise CheckpointMismatchError(
            f"The checkpoint holds {saved['models']} model(s) and {saved['optimizers']} optimizer(s), this run "
            f"prepared {len(models)} and {len(optimizers)}: prepare the same objects, in the same order, as the run "
            "that saved it."
        )
    shard = _shard_folder(folder)
    for i, model in enumerate(models):
        model.load_state_dict(io.load_torch_file(os.path.join(shard, f"model_{i}.pt")))
    for i, optimizer in enumerate(optimizers):
        unwrap_optimizer(optimizer).load_state_dict(io.load_torch_file(os.path.join(shard, f"optimizer_{i}.pt")))
    rng.set_tracker_states(io.load_torch_file(os.path.join(shard, "rng_tracker.pt")))
